"""Compile the step's kernels before serving: a short scripted workload run through the engine at start-up.

Triton compiles a kernel on its first launch for each specialisation (constexpr configs chosen by the step's token
count, integer arguments equal to 1 or divisible by 16), and the decode graphs cover only decode steps of the captured
batch sizes. Without this, the first prefill chunks of each size, and the first mixed steps (decode rows beside a
prefill chunk), stop the whole engine for seconds while they compile: in the fourteenth session's AgentX-style run
(cold compile cache, 16 sessions) generation fell to 0.7 tok/s in some 10-second intervals and p90 inter-token latency
to 48 ms. The workload: one request decoding throughout while short prompts arrive beside it one at a time (steps of
2 to 51 tokens), then prompts of assorted lengths (below and at the per-step chunk limit, divisible by 16 and not) all
together; then many decoding rows with a prompt arriving among them;
then follow-up turns that extend the longer prompts (prefix-cache hits: chunks that start past a cached prefix, as an
agent's next turn does) beside a decoding row.

Afterwards nothing of it remains: its requests are released, the prefix caches and window checkpoints are emptied, the
cache and preemption counters start from zero, and the prefill budgets (`--target-itl-ms`) forget the step times they
saw (compilation inflated them). Random token ids under a private cache salt; greedy, EOS ignored, so the workload's
length does not depend on the weights.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..cache.manager import CacheStats
from .sampling_params import SamplingParams
from .step_stats import StepStats

if TYPE_CHECKING:
    from .llm_engine import LLMEngine

log = logging.getLogger("v4serve.warmup")
SALT = "v4serve-warmup"
# prompt lengths beside a decoding request: short, mid, a block and a little past it, long; the chunk limit is added
LENGTHS = (1, 7, 64, 100, 256, 300, 1000, 1024, 2065)
# prompts that arrive one at a time beside the decoding request first: steps of 2, 3, 8, 13, 25 and 51 tokens, each
# power-of-two class of a small step (the GEMV's row tile, the attention's split count: constexprs) at least once
SINGLES = (1, 2, 7, 12, 24, 50)
DECODERS = 16  # rows decoding at once in the second phase
FOLLOW_UPS = (5, 100, 300, 16)  # new tokens of the follow-up turns (on the prompts of at least two blocks)
MAX_STEPS = 10_000  # a guard: the workload needs a few hundred steps


@dataclass(frozen=True)
class WarmupReport:
    requests: int
    steps: int
    prompt_tokens: int
    prefix_hits: int  # follow-up turns served partly from the prefix cache (before it was emptied)
    seconds: float


def warm_up(engine: LLMEngine, lengths: tuple[int, ...] = LENGTHS, decoders: int = DECODERS,
            singles: tuple[int, ...] = SINGLES) -> WarmupReport:
    """Run the scripted workload through `engine` and leave it as it was (see the module docstring). The prefill gate
    is off meanwhile: the script's steps must have the shapes it writes (a prompt beside the decoding row at once),
    not wait for 20 decode steps or the gate's delay."""
    gates = [s.prefill_gate.every for s in engine.schedulers]
    for s in engine.schedulers:
        s.prefill_gate.every = 0
    try:
        return _scripted(engine, lengths, decoders, singles)
    finally:
        for s, every in zip(engine.schedulers, gates):
            s.prefill_gate.every = every


def _scripted(engine: LLMEngine, lengths: tuple[int, ...], decoders: int, singles: tuple[int, ...]) -> WarmupReport:
    t0 = time.monotonic()
    cfg = engine.cfg
    limit = engine.max_model_len - 8
    chunk = min(cfg.max_num_batched_tokens, limit)
    lens = sorted({min(n, limit) for n in (*lengths, chunk) if n >= 1})
    gen = torch.Generator().manual_seed(0)
    vocab = engine.model_config.vocab_size

    def prompt(n: int) -> list[int]:
        return torch.randint(0, vocab, (n,), generator=gen).tolist()

    def params(max_tokens: int) -> SamplingParams:
        return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)

    ids: list[str] = []
    steps = 0

    def run(until_idle: bool, at_most: int = MAX_STEPS) -> None:
        nonlocal steps
        for _ in range(at_most):
            if until_idle and not engine.has_unfinished():
                return
            engine.step()
            steps += 1
        if until_idle and engine.has_unfinished():
            raise RuntimeError(f"warm-up did not finish in {MAX_STEPS} steps")

    prompts: list[list[int]] = []

    def add(n: int, max_tokens: int, prefix: list[int] | None = None) -> None:
        p = (prefix or []) + prompt(n)
        prompts.append(p)
        ids.extend(engine.add_request(p, params(max_tokens), request_id=f"warmup-{len(ids)}", cache_salt=SALT))

    # phase 1: one row decoding while the prompts arrive (mixed steps), long enough to outlast them: first one at a
    # time (a step of the decoding row and that prompt), then all together
    singles = [n for n in singles if n <= limit - 40]
    add(33, max_tokens=min(64 + 4 * len(lens) + 2 * len(singles), limit - 33))
    run(False, at_most=3)
    for n in singles:
        add(n, max_tokens=1)
        run(False, at_most=2)
    for n in lens:
        add(n, max_tokens=3)
    run(True)
    # phase 2: many decoding rows (the graphs' larger buckets), then a prompt among them
    for _ in range(decoders):
        add(20, max_tokens=12)
    run(False, at_most=4)
    add(min(600, limit), max_tokens=2)
    run(True)
    # phase 3: follow-up turns (the earlier prompts extended: prefix-cache hits, chunks starting past a cached prefix)
    # beside a decoding row
    bases = [p for p in prompts if 2 * cfg.block_size <= len(p)]
    if bases:
        add(33, max_tokens=min(16 + 4 * len(FOLLOW_UPS), limit - 33))
        run(False, at_most=3)
        for n in FOLLOW_UPS:  # on the longest earlier prompt that leaves room
            base = max((p for p in bases if len(p) + n + 3 <= limit), key=len, default=None)
            if base is not None:
                add(n, max_tokens=3, prefix=base)
        run(True)
    hits = sum(s.kv.stats.hits for s in engine.schedulers)
    for rid in ids:
        engine.release(rid)
    _forget(engine)
    report = WarmupReport(len(ids), steps, sum(len(p) for p in prompts), hits, time.monotonic() - t0)
    log.info("warm-up: %d requests (%d prefix hits), %d steps, %d prompt tokens in %.1f s (the step's kernels "
             "compiled before serving)", report.requests, report.prefix_hits, report.steps, report.prompt_tokens,
             report.seconds)
    return report


def _forget(engine: LLMEngine) -> None:
    """The engine's caches, counters and step-time estimates as a fresh engine has them."""
    for s in engine.schedulers:
        s.kv.reset_prefix_cache()
        s.kv.stats = CacheStats()
        s.kv.pool.evictions = 0
        s.num_preemptions = 0
        s.prefill_budget.reset()
        s.prefill_gate.reset()
    engine.last_step_tokens = engine.last_step_rows = 0
    engine.step_stats = StepStats()
