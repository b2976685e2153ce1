"""Host time per decode step spent on each row's token bookkeeping, at agent-session context lengths (CPU only).

    python benchmarks/host_step.py [--context 142000] [--batch 32]

Times what the engine does on the host for every decoding row and step: the prefix cache's `after_step` (hash any
newly completed block, publish it) and reading the row's new token for the step input. "before" re-creates what the
code did until this commit — concatenating prompt + output on each access, converting the whole token list to an
array to hash, registering every block again each step — as a reference point.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from v4serve.cache.manager import CacheGeometry, KVCacheManager  # noqa: E402
from v4serve.cache.prefix import block_hashes  # noqa: E402
from v4serve.engine.request import Request  # noqa: E402
from v4serve.engine.sampling_params import SamplingParams  # noqa: E402


def _old_block_hashes(tokens, block_size, salt, start):
    """The hashing as it was: the whole token list converted to an array on every call."""
    np.asarray(tokens, dtype=np.int64)
    return block_hashes(tokens, block_size, salt, start)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=142_000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    B = 256
    kv = KVCacheManager(CacheGeometry(B, 128, 43, (4, 128)), num_blocks=args.batch * (args.context // B + 8),
                        max_num_seqs=args.batch, num_checkpoints=0, caching=True, bounded_replay=False)
    rng = np.random.default_rng(0)
    reqs = []
    for i in range(args.batch):
        r = Request(f"r{i}", rng.integers(0, 129280, args.context).tolist(), SamplingParams(max_tokens=10_000))
        kv.admit(r)
        kv.ensure_blocks(r, r.num_tokens + args.steps + 1)
        r.cache.num_computed = r.num_tokens
        kv.after_step(r)
        reqs.append(r)

    def new_step() -> None:
        for r in reqs:
            r.output_token_ids.append(1)
            r.cache.num_computed += 1
            kv.after_step(r)
            r.tokens[r.num_computed - 1:r.num_computed]

    def old_step() -> None:
        for r in reqs:
            full = r.num_computed // B
            hashes = _old_block_hashes(r.all_token_ids[: full * B], B, r.cache_salt, r.cache.block_hashes)
            for i in range(full):
                kv.pool.register(r.cache.blocks[i], hashes[i])
            r.all_token_ids[r.num_computed - 1:r.num_computed]

    for name, fn in (("before", old_step), ("now", new_step)):
        t = time.perf_counter()
        for _ in range(args.steps):
            fn()
        ms = (time.perf_counter() - t) / args.steps * 1e3
        print(f"{name:6s}: {ms:8.2f} ms of host time per step at batch {args.batch}, context {args.context:,}")


if __name__ == "__main__":
    main()
