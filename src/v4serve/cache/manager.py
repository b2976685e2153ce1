"""KV-cache bookkeeping for the scheduler: slots, blocks, prefix hits (with their window state) and stats.

The manager never touches tensors. Slot operations the device must perform (forget a slot's compressor
state, restore or take a window checkpoint) are queued as `SlotOp`s and applied by the runner before the next
forward, in order.

How a prefix hit at block boundary M is made exact or approximate:
* V4.1 with SWA bounded replay (default): recompute positions [M - window, M) through every layer with their
  window attention clipped at M - window, reusing the cached compressed entries. Approximate by design.
* Exact (V4, and V4.1 with --no-swa-bounded-replay): the cheaper of (a) restoring a window checkpoint taken at a
  boundary C <= M and computing from C, or (b) replaying from S = M - R (rounded down to a multiple of every
  compress ratio, so compressor groups start clean), where R = window + (L - 1)(window - 1) is the depth of the
  window dependency through L layers, so that every layer's window at M is exact.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from .prefix import BlockPool, CheckpointStore, block_hashes
from .seq_state import CachedSequence


@dataclass
class SlotOp:
    kind: str  # "reset" (forget compressor state) or "copy" (dst <- src: all windows and states)
    dst: int
    src: int = -1


@dataclass
class CacheStats:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    hits: int = 0
    misses: int = 0
    miss_reasons: Counter = field(default_factory=Counter)
    hit_kinds: Counter = field(default_factory=Counter)  # checkpoint / exact_replay / bounded_replay
    replayed_tokens: int = 0
    checkpoints_taken: int = 0

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@dataclass
class CacheGeometry:
    block_size: int
    window: int
    n_layers: int
    ratios: tuple[int, ...]  # distinct compress ratios in use

    @property
    def replay_depth(self) -> int:
        """Positions an exact window rebuild must recompute: window + (L - 1)(window - 1)."""
        return self.window + (self.n_layers - 1) * (self.window - 1)

    @property
    def group_align(self) -> int:
        return math.lcm(*self.ratios) if self.ratios else 1


class KVCacheManager:
    def __init__(self, geometry: CacheGeometry, num_blocks: int, max_num_seqs: int, num_checkpoints: int,
                 caching: bool, bounded_replay: bool):
        self.g = geometry
        self.caching = caching
        self.bounded = bounded_replay
        self.pool = BlockPool(num_blocks, caching)
        self.free_slots = list(range(max_num_seqs - 1, -1, -1))
        ckpt_slots = range(max_num_seqs, max_num_seqs + (num_checkpoints if caching and not bounded_replay else 0))
        self.checkpoints = CheckpointStore(ckpt_slots)
        self.pool.on_evict = self.checkpoints.drop
        self.pending: list[SlotOp] = []
        self.stats = CacheStats()
        self._used_slots = 0
        self._ckpt_slot = -1

    # --- admission --------------------------------------------------------------------------------
    def has_free_slot(self) -> bool:
        return bool(self.free_slots)

    def admit(self, seq: CachedSequence) -> None:
        """Give the sequence a slot and apply the longest usable prefix hit (sets num_computed etc.)."""
        c = seq.cache
        c.slot = self.free_slots.pop()
        self._used_slots += 1
        c.window_floor = 0
        c.cached_len = 0
        c.num_computed = 0
        c.blocks = []
        c.num_registered = 0
        start, kind = self._match(seq)
        if kind == "checkpoint":
            self.pending.append(SlotOp("copy", c.slot, self._ckpt_slot))
        else:
            self.pending.append(SlotOp("reset", c.slot))
        c.num_computed = start
        if seq.num_preemptions == 0:  # usage counts the first admission only
            c.num_cached_tokens = start
            self.stats.prompt_tokens += seq.num_prompt_tokens
            self.stats.cached_tokens += start
            if start:
                self.stats.hits += 1
                self.stats.hit_kinds[kind] += 1
            else:
                self.stats.misses += 1

    def _match(self, seq: CachedSequence) -> tuple[int, str]:
        B, W = self.g.block_size, self.g.window
        st = seq.cache
        if not self.caching:
            return self._miss(seq, "disabled")
        st.block_hashes = block_hashes(seq.tokens, B, seq.cache_salt, st.block_hashes)
        max_blocks = (seq.num_tokens - 1) // B
        if max_blocks == 0:
            return self._miss(seq, "shorter_than_block")
        k = 0
        while k < max_blocks and self.pool.lookup(st.block_hashes[k]) is not None:
            k += 1
        if k == 0:
            return self._miss(seq, "evicted" if self.pool.was_evicted(st.block_hashes[0]) else "no_prefix")
        M = k * B
        if self.bounded:
            if M <= W:
                return self._miss(seq, "within_window")
            start, kind = M - W, "bounded_replay"
        else:
            ck = 0
            for c in range(k, 0, -1):
                slot = self.checkpoints.lookup(st.block_hashes[c - 1])
                if slot is not None:
                    ck, self._ckpt_slot = c * B, slot
                    break
            align = self.g.group_align
            replay = max(0, (M - self.g.replay_depth) // align * align)
            if ck == 0 and replay == 0:
                return self._miss(seq, "no_window_state")
            start, kind = (ck, "checkpoint") if ck >= replay else (replay, "exact_replay")
        for i in range(k):
            b = self.pool.lookup(st.block_hashes[i])
            self.pool.acquire(b)
            st.blocks.append(b)
        st.cached_len = M
        if kind != "checkpoint":
            st.window_floor = start
            self.stats.replayed_tokens += M - start
        return start, kind

    def _miss(self, seq: CachedSequence, reason: str) -> tuple[int, str]:
        if seq.num_preemptions == 0:
            self.stats.miss_reasons[reason] += 1
        return 0, "miss"

    # --- blocks -----------------------------------------------------------------------------------
    def blocks_needed(self, seq: CachedSequence, upto: int) -> int:
        return max(0, -(-upto // self.g.block_size) - len(seq.cache.blocks))

    def ensure_blocks(self, seq: CachedSequence, upto: int) -> bool:
        """Allocate blocks so positions < upto are addressable; False (nothing taken) if the pool is short."""
        need = self.blocks_needed(seq, upto)
        if need > self.pool.num_free:
            return False
        for _ in range(need):
            b = self.pool.allocate()
            assert b is not None
            seq.cache.blocks.append(b)
        return True

    def free(self, seq: CachedSequence) -> None:
        """Return the sequence's blocks (cached ones stay findable) and slot; its checkpoint stays cached."""
        st = seq.cache
        for b in st.blocks:
            self.pool.release(b)
        st.blocks = []
        st.num_registered = 0
        if st.slot >= 0:
            self.free_slots.append(st.slot)
            self._used_slots -= 1
            st.slot = -1

    # --- after a step -----------------------------------------------------------------------------
    def after_step(self, seq: CachedSequence) -> None:
        """Publish newly completed blocks to the prefix cache; snapshot the window at a new boundary."""
        if not self.caching:
            return
        B = self.g.block_size
        st = seq.cache
        full = st.num_computed // B
        if full == 0:
            return
        if len(st.block_hashes) < full:
            st.block_hashes = block_hashes(seq.tokens, B, seq.cache_salt, st.block_hashes, limit=full)
        for i in range(st.num_registered, full):  # registering is idempotent; only new blocks need it
            self.pool.register(st.blocks[i], st.block_hashes[i])
        st.num_registered = max(st.num_registered, full)
        if self.bounded or st.num_computed % B or st.num_computed < self.g.window:
            return
        h = st.block_hashes[full - 1]
        if h == st.checkpoint_hash:
            return
        slot = self.checkpoints.take(h)
        if slot is None:
            return
        self.pending.append(SlotOp("copy", slot, st.slot))
        if st.checkpoint_hash is not None:
            self.checkpoints.drop(st.checkpoint_hash)  # keep only the latest boundary per sequence
        st.checkpoint_hash = h
        self.stats.checkpoints_taken += 1

    def cancel_admission(self, seq: CachedSequence) -> None:
        """Undo `admit` for a sequence that could not get its first blocks (it stays waiting)."""
        slot = seq.cache.slot
        self.free(seq)
        self.pending = [op for op in self.pending if op.dst != slot]

    def take_ops(self) -> list[SlotOp]:
        ops, self.pending = self.pending, []
        return ops

    def reset_prefix_cache(self) -> None:
        self.pool.reset()
        self.checkpoints.reset()
