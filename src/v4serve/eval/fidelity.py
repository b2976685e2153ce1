"""`v4serve eval fidelity MODEL`: what SWA bounded replay (and V4.1's trimmed decoder prefill) costs.

For a set of two-turn sessions, the same requests run through an exact engine (`--no-swa-bounded-replay`: window
checkpoints / exact replay, every layer on every token) and a bounded engine (the V4.1 default). Turn 1 fills each
engine's prefix cache; turn 2 extends turn 1 (prompt + the exact engine's reply + new tokens), so it is served from the
cache exactly as in an agent session. Measured on turn 2:

* next-token distributions at every position of a teacher-forced continuation (the exact engine's greedy reply):
  KL(exact || bounded) and top-1 agreement, per position and overall (full-vocabulary logits, not top-k);
* the share of identical greedy continuations (and the mean agreeing prefix);
* the prompt tokens each engine served from the cache.

Sessions are random token sequences from a seed (`--sessions`, `--prompt-len`, `--new-len`, `--continuation`), so the
measurement needs no data and works on random-weight models.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .divergence import greedy_match, kl_divergence


@dataclass
class Session:
    prompt1: list[int]
    new: list[int]
    reply1: list[int] = field(default_factory=list)  # the exact engine's turn-1 reply
    continuation: list[int] = field(default_factory=list)  # the exact engine's turn-2 greedy reply

    @property
    def prompt2(self) -> list[int]:
        return self.prompt1 + self.reply1 + self.new


def make_sessions(n: int, prompt_len: int, new_len: int, seed: int, vocab: int = 129280) -> list[Session]:
    rng = random.Random(seed)
    return [Session([rng.randrange(1000, vocab - 1000) for _ in range(prompt_len)],
                    [rng.randrange(1000, vocab - 1000) for _ in range(new_len)]) for _ in range(n)]


class LogitsTap:
    """Collects the full logits of prompt positions from the engine's runner (for teacher forcing)."""

    def __init__(self) -> None:
        self.rows: dict[str, list[torch.Tensor]] = {}

    def __call__(self, sched, logits: torch.Tensor, logits_from: list[int]) -> None:
        cursor = 0
        for row, first in zip(sched.rows, logits_from):
            if first >= 0:
                n = row.start + row.num_tokens - first
                self.rows.setdefault(row.request.request_id, []).append(logits[cursor:cursor + n].float().cpu())
                cursor += n
            elif row.sample:
                cursor += 1


def _run(engine, prompt: list[int], max_tokens: int, **kw) -> Any:
    from ..engine.sampling_params import SamplingParams

    rid = engine.add_request(prompt, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True,
                                                    prompt_logprobs=kw.pop("prompt_logprobs", None)), **kw)[0]
    while engine.has_unfinished():
        engine.step()
    return engine.release(rid)


def _turn1(engine, s: Session, reply_len: int) -> Any:
    """Turn 1 on an otherwise empty prefix cache, so the following turn 2 sees exactly its own turn 1 cached."""
    engine.kv.reset_prefix_cache()
    return _run(engine, s.prompt1, reply_len)


def teacher_forced_logits(engine, tap: LogitsTap, s: Session) -> torch.Tensor:
    """Next-token logits at each position of the continuation, after turn 2's (cached) prompt."""
    p2 = s.prompt2
    req = _run(engine, p2 + s.continuation, 1, prompt_logprobs=0, trim_target=len(p2))
    rows = torch.cat(tap.rows.pop(req.request_id))
    # rows cover positions [first, end); keep those predicting the continuation: positions len(p2)-1 .. end-2
    want = len(s.continuation)
    if rows.shape[0] < want + 1:
        raise RuntimeError(f"turn 2 computed only {rows.shape[0]} positions; the cache must end before the prompt does")
    return rows[rows.shape[0] - 1 - want: rows.shape[0] - 1]


def run_fidelity(model: str, sessions: list[Session], continuation: int, engine_kwargs: dict[str, Any],
                 reply_len: int = 16) -> dict[str, Any]:
    from ..engine.config import EngineConfig
    from ..engine.llm_engine import LLMEngine

    results: dict[str, Any] = {"model": model, "sessions": len(sessions), "continuation": continuation}
    per_mode: dict[str, dict[str, Any]] = {}
    for mode, bounded in (("exact", False), ("bounded", True)):
        eng = LLMEngine(model, EngineConfig(**{**engine_kwargs, "swa_bounded_replay": bounded}))
        tap = LogitsTap()
        eng.runner.logits_tap = tap
        logits, greedy, cached = [], [], []
        for s in sessions:
            r1 = _turn1(eng, s, reply_len)
            if mode == "exact":
                s.reply1 = list(r1.output_token_ids)
                s.continuation = list(_run(eng, s.prompt2, continuation).output_token_ids)
            _turn1(eng, s, reply_len)
            logits.append(teacher_forced_logits(eng, tap, s))
            _turn1(eng, s, reply_len)
            g = _run(eng, s.prompt2, continuation)
            greedy.append(list(g.output_token_ids))
            cached.append(g.num_cached_tokens)
        per_mode[mode] = {"logits": logits, "greedy": greedy, "cached": cached,
                          "hit_kinds": eng.stats()["prefix_hit_kinds"], "config": eng.model_config.family}
        del eng
    ex, bd = per_mode["exact"], per_mode["bounded"]
    kl = [kl_divergence(a.numpy(), b.numpy()) for a, b in zip(ex["logits"], bd["logits"])]
    agree = [(a.argmax(-1) == b.argmax(-1)).numpy() for a, b in zip(ex["logits"], bd["logits"])]
    n_pos = min(len(k) for k in kl)
    kl_pos = np.stack([k[:n_pos] for k in kl])
    agree_pos = np.stack([a[:n_pos] for a in agree]).astype(float)
    flat = np.concatenate(kl)
    results.update({
        "kl_mean": float(flat.mean()), "kl_median": float(np.median(flat)), "kl_p99": float(np.percentile(flat, 99)),
        "kl_max": float(flat.max()), "top1_agreement": float(np.concatenate(agree).mean()),
        "kl_by_position": kl_pos.mean(0).tolist(), "top1_by_position": agree_pos.mean(0).tolist(),
        "greedy": greedy_match(ex["greedy"], bd["greedy"]),
        "exact_reproduces_itself": greedy_match([s.continuation for s in sessions], ex["greedy"]),
        "cached_tokens": {"exact": ex["cached"], "bounded": bd["cached"]},
        "hit_kinds": {"exact": ex["hit_kinds"], "bounded": bd["hit_kinds"]},
    })
    return results


def format_fidelity(r: dict[str, Any]) -> str:
    g = r["greedy"]
    lines = [
        f"fidelity of SWA bounded replay vs exact, {r['model']}: {r['sessions']} sessions, {r['continuation']}-token "
        "teacher-forced continuations after a cached turn",
        f"  KL(exact || bounded) per position: mean {r['kl_mean']:.3g}, median {r['kl_median']:.3g}, "
        f"p99 {r['kl_p99']:.3g}, max {r['kl_max']:.3g} nats",
        f"  top-1 agreement: {r['top1_agreement']:.3f}",
        f"  identical greedy continuations: {g['identical_share']:.3f} (mean agreeing prefix "
        f"{g['mean_prefix_share']:.3f})",
        f"  cached prompt tokens, exact: {sum(r['cached_tokens']['exact'])}, bounded: "
        f"{sum(r['cached_tokens']['bounded'])} ({r['hit_kinds']})",
    ]
    return "\n".join(lines)


def add_fidelity_parser(sub: Any) -> None:
    p = sub.add_parser("fidelity", help="offline: KL / top-1 / greedy agreement of bounded replay vs exact")
    p.add_argument("model", help="V4.1 preset or checkpoint folder (V4 models give exact == exact)")
    p.add_argument("--sessions", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=600)
    p.add_argument("--new-len", type=int, default=64)
    p.add_argument("--reply-len", type=int, default=16)
    p.add_argument("--continuation", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto")
    p.add_argument("--block-size", type=int, default=256)
    p.add_argument("--kv-cache-memory", type=int, default=None)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--out", help="directory for fidelity-<time>.json")
    p.set_defaults(func=cmd_fidelity)


def cmd_fidelity(args: argparse.Namespace) -> int:
    from ..models.factory import resolve_config

    if not resolve_config(args.model)[0].is_v41:
        raise ValueError(f"{args.model} is a DeepSeek-V4 model: it serves prefix hits exactly, so there is no bounded "
                         "replay to measure; pass a V4.1 model (e.g. tiny-v41-flash)")
    kw = {"device": args.device, "block_size": args.block_size, "max_num_seqs": 2}
    if args.kv_cache_memory:
        kw["kv_cache_memory"] = args.kv_cache_memory
    if args.max_model_len:
        kw["max_model_len"] = args.max_model_len
    sessions = make_sessions(args.sessions, args.prompt_len, args.new_len, args.seed)
    t = time.time()
    r = run_fidelity(args.model, sessions, args.continuation, kw, args.reply_len)
    r["seconds"] = time.time() - t
    print(format_fidelity(r))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"fidelity-{time.strftime('%Y%m%d-%H%M%S')}.json"
        path.write_text(json.dumps(r, indent=2))
        print(f"wrote {path}")
    return 0
