"""SWA bounded replay against the exact path: cold and prefix-hit TTFT, both modes in one run (issue 10, item 5).

    python benchmarks/bounded_replay.py [MODEL] [--contexts 16384,65536] [--new 630] [--kv-cache-dtype fp4] [--out DIR]
    python benchmarks/bounded_replay.py tiny-v41-flash --device cpu --contexts 192,384 --new 24   # a CPU smoke run

For each mode (`--swa-bounded-replay` on, then off: exact) one engine with prefix caching: per context length a cold
prompt of that many random tokens (TTFT = its whole prefill: V4.1's trimmed decoder prefill in bounded mode), then
the agent's next turn — the prompt, the token it produced and `--new` new tokens — whose TTFT is the prefix hit's
(bounded: the window rebuilt from the cached compressed entries; exact: from a window checkpoint, or the prefill of
the uncached tail). Each hit is taken `--repeats` times with fresh new tokens (the median is reported). A warm-up turn
at a short context first, so that no TTFT includes a kernel compile. The table gives TTFT in ms, the cut of bounded
against exact, the tokens served from the cache, and the issue's targets (hit TTFT <= 80 ms at 16K and <= 120 ms at
64K bounded, cold 16K <= 1.5 s, cut >= 30%).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from v4serve import SamplingParams  # noqa: E402
from v4serve.engine.config import EngineConfig  # noqa: E402
from v4serve.engine.llm_engine import LLMEngine  # noqa: E402

TARGETS_MS = {"hit": {16384: 80.0, 65536: 120.0}, "cold": {16384: 1500.0}}


def ttft(eng: LLMEngine, prompt: list[int]) -> tuple[float, list[int], int, list[float]]:
    """(ms from add_request to the first generated token, the generated tokens, prompt tokens served from cache, the
    wall ms of each engine step until then: how many steps a turn takes and which of them costs)."""
    sync = torch.cuda.synchronize if eng.device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    rid = eng.add_request(prompt, SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))[0]
    first, out, cached, steps = None, [], 0, []
    while eng.has_unfinished():
        ts = time.perf_counter()
        for d in eng.step():
            if d.request_id != rid:
                continue
            if d.new_token_ids and first is None:
                first = (time.perf_counter() - t0) * 1e3
            out += d.new_token_ids
            cached = max(cached, d.num_cached_tokens)
        steps.append((time.perf_counter() - ts) * 1e3)  # (max_tokens 1: the turn ends at its first token)
    return first if first is not None else float("nan"), out, cached, steps


def run_mode(args: argparse.Namespace, bounded: bool, contexts: list[int]) -> list[dict]:
    longest = max(contexts) + 2 * args.new + 64
    eng = LLMEngine(args.model, EngineConfig(
        device=args.device, dtype=args.dtype, max_model_len=longest, kv_cache_memory=args.kv_cache_memory,
        kv_cache_dtype=args.kv_cache_dtype, enable_prefix_caching=True, swa_bounded_replay=bounded,
        max_num_seqs=4, max_num_batched_tokens=args.chunk, long_prefill_token_threshold=args.chunk,
        chunk_graph_tokens=args.chunk_graph_tokens))
    V = eng.model_config.vocab_size
    g = torch.Generator().manual_seed(0)

    def tokens(n: int) -> list[int]:
        return torch.randint(100, V - 100, (n,), generator=g).tolist()

    rows = []
    for ctx in [min(contexts) // 4 or 64] + contexts:  # the first: warm-up, not reported
        prompt = tokens(ctx)
        cold_ms, out, _, cold_steps = ttft(eng, prompt)
        hits = []
        for _ in range(args.repeats):
            hit_ms, _, cached, steps = ttft(eng, prompt + out + tokens(args.new))
            hits.append((hit_ms, cached, steps))
        rows.append({"context": ctx, "mode": "bounded" if bounded else "exact", "cold_ms": cold_ms,
                     "hit_ms": statistics.median(h[0] for h in hits), "hit_ms_all": [h[0] for h in hits],
                     "cached_tokens": min(h[1] for h in hits), "new_tokens": args.new + len(out),
                     "cold_step_ms": cold_steps, "hit_step_ms": [h[2] for h in hits]})
    del eng
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return rows[1:]


def _met(ok: bool) -> str:
    return "met" if ok else "not met"


def table(rows: list[dict]) -> list[str]:
    by = {(r["context"], r["mode"]): r for r in rows}
    lines = ["| context | cold bounded ms | cold exact ms | cut | hit bounded ms | hit exact ms | cut | cached tokens "
             "(bounded / exact) | targets |", "|---|---|---|---|---|---|---|---|---|"]
    for ctx in sorted({r["context"] for r in rows}):
        b, e = by[(ctx, "bounded")], by[(ctx, "exact")]
        cut_c, cut_h = 1 - b["cold_ms"] / e["cold_ms"], 1 - b["hit_ms"] / e["hit_ms"]
        goals = [f"{kind} <= {TARGETS_MS[kind][ctx]:.0f}: {_met(b[f'{kind}_ms'] <= TARGETS_MS[kind][ctx])}"
                 for kind in ("hit", "cold") if ctx in TARGETS_MS[kind]]
        goals.append(f"cut >= 30%: {_met(cut_h >= 0.30)}")
        lines.append(f"| {ctx} | {b['cold_ms']:.1f} | {e['cold_ms']:.1f} | {cut_c * 100:.0f}% | {b['hit_ms']:.1f} | "
                     f"{e['hit_ms']:.1f} | {cut_h * 100:.0f}% | {b['cached_tokens']} / {e['cached_tokens']} | "
                     f"{'; '.join(goals)} |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="v41-flash-e16-engram1m")
    ap.add_argument("--contexts", default="16384,65536", help="prompt lengths, comma-separated")
    ap.add_argument("--new", type=int, default=630, help="new tokens in the follow-up turn")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--kv-cache-dtype", default="fp4")
    ap.add_argument("--kv-cache-memory", type=int, default=16 << 30)
    ap.add_argument("--chunk", type=int, default=8192, help="max_num_batched_tokens (prefill chunk)")
    ap.add_argument("--chunk-graph-tokens", type=lambda v: tuple(int(x) for x in v.split(",")), default=(),
                    help="token buckets of chunk graphs (engine/chunk_graphs.py), comma-separated; default none: the "
                         "prompt steps run eagerly")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.device == "cpu":
        args.kv_cache_memory = min(args.kv_cache_memory, 256 << 20)
    contexts = [int(c) for c in args.contexts.split(",")]
    rows = run_mode(args, True, contexts) + run_mode(args, False, contexts)
    lines = table(rows)
    print(f"{args.model}, {args.kv_cache_dtype} KV, follow-up turn of {args.new} new tokens, device {args.device}")
    print("\n".join(lines), flush=True)
    for r in rows:  # a turn's engine steps: one eager prefill step per chunk, the first token from the last
        print(f"{r['mode']} {r['context']}: cold steps {len(r['cold_step_ms'])} "
              f"({', '.join(f'{t:.0f}' for t in r['cold_step_ms'][:6])} ms), hit steps "
              f"{', '.join(f'{t:.1f}' for t in r['hit_step_ms'][0])} ms")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"bounded-replay-{args.model}.json"), "w") as f:
            json.dump({"model": args.model, "kv_cache_dtype": args.kv_cache_dtype, "new": args.new,
                       "chunk": args.chunk, "rows": rows, "table": lines}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
