"""A batch of requests brought to steady decoding, for the scripts that time or count decode steps."""

from __future__ import annotations

import torch

from v4serve.engine.llm_engine import LLMEngine
from v4serve.engine.sampling_params import SamplingParams


def start_decoding(eng: LLMEngine, batch: int, context: int, max_tokens: int, generator: torch.Generator,
                   warm_steps: int = 2) -> None:
    """`batch` greedy requests of `context` random prompt tokens (EOS ignored), prefilled, then `warm_steps` decode
    steps (graphs and kernels warmed up)."""
    sp = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    for _ in range(batch):
        eng.add_request(torch.randint(0, eng.model_config.vocab_size, (context,), generator=generator).tolist(), sp)
    while eng.scheduler.waiting or any(r.in_prefill or r.num_computed == 0 for r in eng.scheduler.running):
        eng.step()
    for _ in range(warm_steps):
        eng.step()
