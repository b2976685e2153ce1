"""Where a graphed decode step's wall time goes on a GPU: host phases, CUDA runtime calls and GPU idle time.

    python benchmarks/step_timeline.py v4-flash-e16 --batch 1 --context 2048 [--steps 20] [--out DIR]

Three views of the same engine (CUDA graphs on, random weights):
* phases: the host time of each part of `LLMEngine.step` (schedule, build, graph inputs, replay launch, sampling,
  outputs), timed with perf_counter around the engine's own methods (no synchronisation added: a phase that waits
  for the GPU shows that wait);
* runtime: torch.profiler's CUDA runtime calls by self CPU time (cudaGraphLaunch, synchronous copies, ...);
* GPU idle: the gaps between device activities over the profiled steps, i.e. the step time the GPU is not busy.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict

import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from decoding import start_decoding  # noqa: E402

from v4serve.engine.config import EngineConfig  # noqa: E402
from v4serve.engine.llm_engine import LLMEngine  # noqa: E402


def wrap(totals: dict[str, float], name: str, obj: object, attr: str) -> None:
    fn = getattr(obj, attr)

    def timed(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            totals[name] += time.perf_counter() - t

    setattr(obj, attr, timed)


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def gpu_idle_ms(prof) -> tuple[float, float]:
    """(busy, span) in ms over the device activities of the profile."""
    spans = sorted((e.start_ns(), e.end_ns()) for e in prof.profiler.kineto_results.events()
                   if e.device_type() == torch.autograd.DeviceType.CUDA and not e.name().startswith("v4serve.")
                   and "annotation" not in (e.activity_type() if hasattr(e, "activity_type") else ""))
    busy, cur_s, cur_e = 0, None, None
    for s, e in spans:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        busy += cur_e - cur_s
    return busy / 1e6, (spans[-1][1] - spans[0][0]) / 1e6 if spans else 0.0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="v4-flash-e16")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--kv-cache-memory", type=int, default=8 << 30)
    ap.add_argument("--out", default=None)
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of the script (no graphs, no GPU idle)")
    args = ap.parse_args()
    dev = torch.device(args.device)
    eng = LLMEngine(args.model, EngineConfig(
        device=args.device, max_num_seqs=args.batch, max_model_len=args.context + 512, kv_cache_memory=args.kv_cache_memory,
        max_num_batched_tokens=max(args.context, 2048), cuda_graph_sizes=(args.batch,), enable_prefix_caching=False))
    start_decoding(eng, args.batch, args.context, 3 * args.steps + 64, torch.Generator().manual_seed(0), warm_steps=3)
    sync(dev)

    totals: dict[str, float] = defaultdict(float)
    runner = eng.runner
    wrap(totals, "schedule", eng.scheduler, "schedule")
    wrap(totals, "advance", eng.scheduler, "advance")
    wrap(totals, "step rows (specs)", runner, "specs")
    wrap(totals, "build eager step", runner, "build")
    wrap(totals, "sample + read tokens", runner, "_sample")
    if runner.graphs is not None:
        wrap(totals, "graph run (inputs + launch)", runner.graphs, "run")
    t = time.perf_counter()
    for _ in range(args.steps):
        eng.step()
    sync(dev)
    step_ms = (time.perf_counter() - t) / args.steps * 1e3
    phases = {k: v / args.steps * 1e3 for k, v in totals.items()}
    phases["rest of LLMEngine.step"] = step_ms - sum(phases.values())
    print(f"{args.model} batch {args.batch}: {step_ms:.2f} ms/step (graphed); host phases, ms/step:")
    for k, v in phases.items():
        print(f"  {k:32s} {v:7.3f}")

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            eng.step()
        sync(dev)
    busy, span = gpu_idle_ms(prof)
    print(f"\nprofiled 5 steps: GPU busy {busy / 5:.2f} ms/step of a {span / 5:.2f} ms/step span "
          f"(idle {(span - busy) / 5:.2f} ms/step)")
    rows = sorted(prof.key_averages(), key=lambda a: -a.self_cpu_time_total)[:25]
    print("\nhost calls by self CPU time (us per step, calls per step):")
    runtime = []
    for a in rows:
        us = a.self_cpu_time_total / 5
        runtime.append({"name": a.key, "us_per_step": us, "calls_per_step": a.count / 5})
        print(f"  {a.key[:60]:60s} {us:9.1f} {a.count / 5:7.1f}")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"step-timeline-{args.model}-b{args.batch}.json"), "w") as f:
            json.dump({"model": args.model, "batch": args.batch, "context": args.context, "step_ms": step_ms,
                       "phases_ms": phases, "gpu_busy_ms": busy / 5, "gpu_span_ms": span / 5,
                       "runtime": runtime}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
