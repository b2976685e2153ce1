"""DEP: which data-parallel rank serves a new request.

Each data-parallel rank has its own scheduler and KV cache, so a session's turns must stay on one rank to hit its
prefix cache. For a new request the router measures, per rank, the longest prefix of the prompt (in full blocks, by
the chain hashes of cache/prefix.py `block_hashes`, cache salt included) that the rank either holds in its prefix cache
or was sent as the whole prompt of an earlier request (remembered by the hash of that prompt's last full block, LRU-
bounded: this covers turns routed while the previous one's blocks are not cached yet). The rank with the longest such
prefix gets the request when that prefix covers at least `min_share` of the prompt (a session's next turn: its
previous prompt and output are most of the new one); otherwise (a new session, or one that only shares a system prompt
with others) the least-loaded rank does: the fewest tokens (prompt + output so far) of running and waiting requests,
the lower rank on a tie. Sibling requests (n > 1) share their rank.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

from ..cache.prefix import block_hashes


class DataParallelRouter:
    def __init__(self, size: int, block_size: int, min_share: float = 0.5, capacity: int = 1 << 16):
        self.size = size
        self.block_size = block_size
        self.min_share = min_share
        self.capacity = capacity
        self.routed: OrderedDict[bytes, int] = OrderedDict()  # last full-block hash of a routed prompt -> its rank
        self.by_prefix = 0  # requests placed on the rank holding their prefix
        self.by_load = 0  # requests placed on the least-loaded rank

    def pick(self, prompt: Sequence[int], salt: str | None, loads: Sequence[int],
             cached: Callable[[int, bytes], bool] | None = None) -> int:
        """The rank for `prompt`; `loads[r]`: rank r's tokens in flight; `cached(r, h)`: whether rank r's prefix
        cache holds the block of chain hash h."""
        hashes = block_hashes(prompt, self.block_size, salt)
        depth = [0] * self.size  # full blocks of the prompt's prefix each rank has
        for i in range(len(hashes) - 1, -1, -1):
            r = self.routed.get(hashes[i])
            if r is not None:
                depth[r] = i + 1
                break
        if cached is not None:
            for r in range(self.size):
                n = 0
                while n < len(hashes) and cached(r, hashes[n]):
                    n += 1
                depth[r] = max(depth[r], n)
        best = max(range(self.size), key=lambda r: (depth[r], -loads[r], -r))
        if depth[best] and depth[best] * self.block_size >= self.min_share * len(prompt):
            rank = best
            self.by_prefix += 1
        else:
            rank = min(range(self.size), key=lambda r: (loads[r], r))
            self.by_load += 1
        if hashes:
            self.routed[hashes[-1]] = rank
            self.routed.move_to_end(hashes[-1])
            while len(self.routed) > self.capacity:
                self.routed.popitem(last=False)
        return rank
