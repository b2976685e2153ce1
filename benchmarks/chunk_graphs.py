"""Steps with prompt tokens, eager against the chunk graphs (engine/chunk_graphs.py), in one run: the wall time of a
mixed step (the decode rows beside a new prompt) and of a prompt-only step, the replays, the capture time.

    python benchmarks/chunk_graphs.py v4-flash-l8-e16 --batch 16 --context 4096 --prompts 64,512 [--steps 5]

Each step adds one prompt of N tokens (max_tokens 1) to B decoding rows; the mixed steps time N tokens + B rows, the
"prompt-only" ones run with no decode rows. The eager steps are host bound (RESULTS.md, eighteenth session): the gap
between the two columns is the host time the graphs take away.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from decoding import start_decoding  # noqa: E402

from v4serve.engine.config import EngineConfig  # noqa: E402
from v4serve.engine.llm_engine import LLMEngine  # noqa: E402
from v4serve.engine.sampling_params import SamplingParams  # noqa: E402


def timed_steps(eng: LLMEngine, tokens: int, steps: int, g: torch.Generator) -> float:
    """ms a step, each step adding one new prompt of `tokens` tokens (after 2 untimed steps)."""
    sp = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    times = []
    for i in range(steps + 2):
        eng.add_request(torch.randint(0, eng.model_config.vocab_size, (tokens,), generator=g).tolist(), sp)
        torch.cuda.synchronize()
        t = time.perf_counter()
        eng.step()
        torch.cuda.synchronize()
        if i >= 2:
            times.append((time.perf_counter() - t) * 1e3)
    return sorted(times)[len(times) // 2]


def run(model: str, args, chunk_tokens: tuple[int, ...]) -> dict:
    t0 = time.perf_counter()
    eng = LLMEngine(model, EngineConfig(
        device="cuda", max_num_seqs=args.batch + 4, max_model_len=args.context + 2048,
        kv_cache_memory=args.kv_cache_memory, max_num_batched_tokens=max(2048, max(args.prompts) + args.batch),
        long_prefill_token_threshold=max(2048, max(args.prompts)), chunk_graph_tokens=chunk_tokens,
        async_scheduling=False, decode_steps_between_prefills=0, kv_cache_dtype=args.kv_cache_dtype,
        swa_bounded_replay=False if args.exact else None))
    start = time.perf_counter() - t0
    g = torch.Generator().manual_seed(0)
    out = {"chunk_graph_tokens": list(chunk_tokens), "start_s": round(start, 1), "steps": {}}
    for n in args.prompts:  # prompt-only steps first, then beside the decode rows
        out["steps"][f"prompt {n}"] = round(timed_steps(eng, n, args.steps, g), 2)
    start_decoding(eng, args.batch, args.context, 4 * args.steps * len(args.prompts) + 64, g)
    for n in args.prompts:
        out["steps"][f"{args.batch} rows + prompt {n}"] = round(timed_steps(eng, n, args.steps, g), 2)
    cg = eng.runner.chunk_graphs
    out["chunk_replays"] = cg.replays if cg is not None else 0
    out["max_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    del eng
    torch.cuda.empty_cache()
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--prompts", type=lambda s: [int(x) for x in s.split(",")], default=[64, 512])
    ap.add_argument("--buckets", type=lambda s: tuple(int(x) for x in s.split(",")),
                    default=(64, 128, 256, 512, 1024, 2048))
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--kv-cache-memory", type=int, default=8 << 30)
    ap.add_argument("--kv-cache-dtype", default="auto")
    ap.add_argument("--exact", action="store_true", help="V4.1: no bounded replay (no decoder trim)")
    ap.add_argument("--out", default=os.environ.get("OUT"))
    args = ap.parse_args()
    res = {"model": args.model, "gpu": torch.cuda.get_device_name(), "eager": run(args.model, args, ()),
           "graphs": run(args.model, args, args.buckets)}
    print(f"{args.model}: step ms (median of {args.steps}), eager prompt steps vs chunk graphs {args.buckets}")
    for k, v in res["eager"]["steps"].items():
        w = res["graphs"]["steps"][k]
        print(f"  {k:28s} eager {v:9.2f}   graphs {w:9.2f}   ({v / w:.2f}x)")
    print(f"  start-up s: eager {res['eager']['start_s']}, graphs {res['graphs']['start_s']}; chunk replays "
          f"{res['graphs']['chunk_replays']}; peak memory GiB {res['eager']['max_memory_gib']} / "
          f"{res['graphs']['max_memory_gib']}")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"chunk-graphs-{args.model}.json"), "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
