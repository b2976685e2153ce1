"""Where an eager step's host time goes: cProfile over eager decode steps and over mixed steps (the decode rows beside a
new prompt), after warm steps that compile every kernel they launch.

    python benchmarks/host_profile.py v4-flash-l8-e16 --batch 16 --context 4096 --mixed 512 [--steps 5] [--out DIR]

An eager step whose wall time is far above its GPU time (profile_step.py --mixed) is host bound: this names the Python
functions that take it, by own time and by cumulative time, and sums own time by source file.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time
from collections import defaultdict

import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from decoding import start_decoding  # noqa: E402

from v4serve.engine.config import EngineConfig  # noqa: E402
from v4serve.engine.llm_engine import LLMEngine  # noqa: E402
from v4serve.engine.sampling_params import SamplingParams  # noqa: E402


def by_file(stats: pstats.Stats, top: int) -> list[str]:
    own: dict[str, float] = defaultdict(float)
    for (path, _line, _fn), (_cc, _nc, tt, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        own[path] += tt
    rows = sorted(own.items(), key=lambda kv: -kv[1])[:top]
    return [f"{t * 1e3:10.2f} ms  {p}" for p, t in rows]


def report(title: str, prof: cProfile.Profile, n: int, top: int) -> str:
    out = io.StringIO()
    st = pstats.Stats(prof, stream=out)
    st.sort_stats("tottime").print_stats(top)
    st.sort_stats("cumulative").print_stats(top)
    return f"\n===== {title} (totals over {n} steps)\n" + "\n".join(by_file(st, 25)) + "\n" + out.getvalue()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--mixed", type=int, default=512, help="prompt tokens of each mixed step (0: none)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--top", type=int, default=45)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--kv-cache-memory", type=int, default=8 << 30)
    ap.add_argument("--out", default=os.environ.get("OUT"))
    args = ap.parse_args()
    dev = torch.device(args.device)
    eng = LLMEngine(args.model, EngineConfig(
        device=args.device, max_num_seqs=args.batch + 4, max_model_len=args.context + 1024,
        kv_cache_memory=args.kv_cache_memory, max_num_batched_tokens=max(2048, args.mixed + args.batch),
        enforce_eager=True, enable_prefix_caching=False))
    g = torch.Generator().manual_seed(0)
    start_decoding(eng, args.batch, args.context, 6 * args.steps + 32, g)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    def step(prompt: bool) -> None:
        if prompt:
            eng.add_request(torch.randint(0, eng.model_config.vocab_size, (args.mixed,), generator=g).tolist(),
                            SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))
        eng.step()
        sync()

    kinds = [("decode-only", False)] + ([("mixed", True)] if args.mixed else [])
    text = []
    for name, prompt in kinds:
        for _ in range(3):
            step(prompt)  # compiles what this kind of step launches
        sync()
        t = time.perf_counter()
        for _ in range(args.steps):
            step(prompt)
        wall = (time.perf_counter() - t) / args.steps * 1e3
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.steps):
            step(prompt)
        prof.disable()
        line = f"{name} eager step: {wall:.2f} ms wall (no profiler), {args.batch} decode rows" + \
            (f" + {args.mixed} prompt tokens" if prompt else "")
        print(line, flush=True)
        text.append(line + report(name, prof, args.steps, args.top))
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            prof.dump_stats(os.path.join(args.out, f"host-{args.model}-{name}.pstats"))
    print("\n".join(text))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
