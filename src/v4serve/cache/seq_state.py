"""One sequence's KV-cache state, and the narrow view of a request that the cache manager reads.

The engine's `Request` owns a `SeqCacheState` (`req.cache`) and satisfies `CachedSequence`, so cache/ works on
requests without importing engine/ (lower layers never import higher ones; docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class SeqCacheState:
    """Where a sequence's KV lives and how much of it is valid. Written by `KVCacheManager`, except `num_computed`,
    which the scheduler also advances after each step and zeroes on preemption."""

    slot: int = -1  # per-sequence window ring + compressor state; -1 while not admitted
    blocks: list[int] = field(default_factory=list)  # block table: paged compressed entries and index keys
    block_hashes: list[bytes] = field(default_factory=list)  # chain hashes of full blocks of all tokens
    num_registered: int = 0  # leading blocks already published to the prefix cache (manager.after_step)
    num_computed: int = 0  # positions whose KV is in the cache
    window_floor: int = 0  # replay start: window KV below it is not visible
    cached_len: int = 0  # compressed entries below this are shared from the prefix cache (not rewritten)
    num_cached_tokens: int = 0  # prompt tokens not recomputed at the first admission (usage cached_tokens)
    checkpoint_hash: bytes | None = None  # this sequence's latest window checkpoint


class CachedSequence(Protocol):
    """What `KVCacheManager` reads from a request besides its `SeqCacheState` (all read-only)."""

    @property
    def cache(self) -> SeqCacheState: ...

    @property
    def cache_salt(self) -> str | None: ...

    @property
    def num_preemptions(self) -> int: ...  # usage and hit/miss stats count the first admission only

    @property
    def tokens(self) -> Sequence[int]: ...  # prompt + output

    @property
    def num_tokens(self) -> int: ...

    @property
    def num_prompt_tokens(self) -> int: ...
