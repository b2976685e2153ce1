"""Paged blocks with a prefix cache, and window checkpoints for exact prefix hits.

Blocks: every logical block covers `block_size` positions of one request (its compressed entries and index
keys in every layer). A full block's content is identified by a chain hash over the token ids of all blocks
up to it (plus an optional per-request salt), so equal prefixes map to the same blocks. Freed blocks that hold
a cached prefix stay findable until they are needed again: allocation takes never-cached blocks first, then
evicts cached ones least-recently-used first.

Window checkpoints: the window rings (and compressor partial state) of all layers at a block boundary, copied
into a spare slot. Compressed entries are position-exact and reusable as they are; the window is not, so an
exact hit at boundary M needs either the window state at M (a checkpoint) or a replay of the positions that
the window at M depends on. Each request keeps only its latest checkpoint (the boundary where its next turn
will resume); they are evicted least-recently-used.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence

import numpy as np

ROOT = b"v4serve-prefix-v1"


def block_hashes(tokens: Sequence[int], block_size: int, salt: str | None = None,
                 start: list[bytes] | None = None, limit: int | None = None) -> list[bytes]:
    """Chain hashes of the full blocks of `tokens` (the first `limit` blocks at most), extending an already computed
    prefix `start`. Only the new blocks' tokens are read, so a step costs O(new blocks), not O(context)."""
    out = list(start or [])
    prev = out[-1] if out else hashlib.blake2b(ROOT + (salt or "").encode(), digest_size=16).digest()
    n = len(tokens) // block_size if limit is None else min(limit, len(tokens) // block_size)
    for i in range(len(out), n):
        h = hashlib.blake2b(prev, digest_size=16)
        h.update(np.asarray(tokens[i * block_size:(i + 1) * block_size], dtype=np.int64).tobytes())
        prev = h.digest()
        out.append(prev)
    return out


class BlockPool:
    def __init__(self, num_blocks: int, caching: bool):
        self.num_blocks = num_blocks
        self.caching = caching
        self.ref = [0] * num_blocks
        self.hash_of: list[bytes | None] = [None] * num_blocks
        self.free: deque[int] = deque(range(num_blocks))  # hold no cached content
        self.evictable: OrderedDict[int, None] = OrderedDict()  # cached content, ref 0, LRU first
        self.by_hash: dict[bytes, int] = {}
        self.recently_evicted: OrderedDict[bytes, None] = OrderedDict()  # to attribute misses
        self.on_evict: Callable[[bytes], None] | None = None
        self.evictions = 0

    @property
    def num_free(self) -> int:
        return len(self.free) + len(self.evictable)

    @property
    def num_cached(self) -> int:
        return len(self.by_hash)

    def allocate(self) -> int | None:
        if self.free:
            b = self.free.popleft()
        elif self.evictable:
            b, _ = self.evictable.popitem(last=False)
            self._forget(b)
            self.evictions += 1
        else:
            return None
        self.ref[b] = 1
        return b

    def _forget(self, b: int) -> None:
        h = self.hash_of[b]
        if h is not None:
            self.by_hash.pop(h, None)
            self.hash_of[b] = None
            self.recently_evicted[h] = None
            while len(self.recently_evicted) > 4 * self.num_blocks:
                self.recently_evicted.popitem(last=False)
            if self.on_evict:
                self.on_evict(h)

    def lookup(self, h: bytes) -> int | None:
        return self.by_hash.get(h) if self.caching else None

    def acquire(self, b: int) -> None:
        """Take a reference on a cached block found by lookup."""
        if self.ref[b] == 0:
            self.evictable.pop(b, None)
        self.ref[b] += 1

    def release(self, b: int) -> None:
        self.ref[b] -= 1
        if self.ref[b] > 0:
            return
        if self.caching and self.hash_of[b] is not None:
            self.evictable[b] = None  # most recently used end
        else:
            self.hash_of[b] = None
            self.free.appendleft(b)  # reuse uncached blocks first: they flush nobody's prefix

    def register(self, b: int, h: bytes) -> None:
        """Record that block b holds the content of chain hash h (first writer wins)."""
        if not self.caching or self.hash_of[b] is not None:
            return
        if h in self.by_hash:
            return
        self.by_hash[h] = b
        self.hash_of[b] = h
        self.recently_evicted.pop(h, None)

    def was_evicted(self, h: bytes) -> bool:
        return h in self.recently_evicted

    def reset(self) -> None:
        """Drop every cached prefix (blocks in use keep their data but lose their hashes)."""
        for b in list(self.evictable):
            self.hash_of[b] = None
            self.free.append(b)
        self.evictable.clear()
        for b, h in enumerate(self.hash_of):
            if h is not None:
                self.hash_of[b] = None
        self.by_hash.clear()


class CheckpointStore:
    """Window snapshots at block boundaries, keyed by the chain hash of the block ending there."""

    def __init__(self, slots: Sequence[int]):
        self.free: deque[int] = deque(slots)
        self.by_hash: OrderedDict[bytes, int] = OrderedDict()  # LRU first

    @property
    def capacity(self) -> int:
        return len(self.free) + len(self.by_hash)

    def lookup(self, h: bytes) -> int | None:
        slot = self.by_hash.get(h)
        if slot is not None:
            self.by_hash.move_to_end(h)
        return slot

    def take(self, h: bytes) -> int | None:
        """A slot to snapshot into for boundary h (None if h is already stored or there is no capacity)."""
        if h in self.by_hash:
            self.by_hash.move_to_end(h)
            return None
        if not self.free:
            if not self.by_hash:
                return None
            _, slot = self.by_hash.popitem(last=False)
            self.free.append(slot)
        slot = self.free.popleft()
        self.by_hash[h] = slot
        return slot

    def drop(self, h: bytes) -> None:
        slot = self.by_hash.pop(h, None)
        if slot is not None:
            self.free.append(slot)

    def reset(self) -> None:
        for h in list(self.by_hash):
            self.drop(h)
