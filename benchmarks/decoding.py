"""A batch of requests brought to steady decoding, for the scripts that time or count decode steps."""

from __future__ import annotations

import torch

from v4serve.engine.llm_engine import LLMEngine
from v4serve.engine.sampling_params import SamplingParams


def prompt_steps(batch: int, context: int, budget: int) -> int:
    """Steps that `batch` prompts of `context` tokens take in chunks of a step's token budget, one after another: the
    tokens a row whose prompt is done may decode meanwhile (a token a step), so room its limit and max_model_len
    need."""
    return batch * -(-context // max(1, budget))


def fill_steps(eng: LLMEngine, batch: int, context: int, warm_steps: int = 2) -> int:
    """Steps `start_decoding` may take: the prompts' (prompt_steps), then the warm-up steps."""
    return prompt_steps(batch, context, eng.cfg.max_num_batched_tokens) + warm_steps


def start_decoding(eng: LLMEngine, batch: int, context: int, max_tokens: int, generator: torch.Generator,
                   warm_steps: int = 2) -> None:
    """`batch` greedy requests of `context` random prompt tokens (EOS ignored), prefilled, then `warm_steps` decode
    steps (graphs and kernels warmed up); each may then decode `max_tokens` more tokens. The rows that finished their
    prompts first decode while the others prefill, so each request's token limit covers those steps too (without it,
    a batch of 32 4K prompts in 2K chunks kept ~10 of its 32 rows: the batch-32 figures before the thirty-first
    session's fix); fewer running rows than `batch` afterwards is an error, not a smaller batch."""
    sp = SamplingParams(max_tokens=max_tokens + fill_steps(eng, batch, context, warm_steps), temperature=0,
                        ignore_eos=True)
    for _ in range(batch):
        eng.add_request(torch.randint(0, eng.model_config.vocab_size, (context,), generator=generator).tolist(), sp)
    while eng.scheduler.waiting or any(r.in_prefill or r.num_computed == 0 for r in eng.scheduler.running):
        eng.step()
    for _ in range(warm_steps):
        eng.step()
    running = sum(len(s.running) for s in eng.schedulers)
    if running != batch:
        raise RuntimeError(f"{running} of {batch} requests are decoding after the fill: raise max_model_len or the "
                           "KV cache memory")
