"""What the engine calls for DeepSeek-V4.1: the per-step inputs the model cannot derive from the step itself.

Contract (`step_hook(sched, step)`, called by the runner on every step it builds):
* it sets `step.engram_prev_ids`: int64 [T, max_ngram - 1] on the step's device; row t holds the token ids at
  positions p-1, p-2, p-3 of token t (p = its position), -1 before the sequence start. Built from each scheduled
  row's request token list, so n-grams span chunk and decode-step boundaries. Image placeholders are passed as they
  are (the hasher treats them as dead).
The decoder trim needs nothing more: the runner already sets `decoder_floor` per row (0 = exact). When it knows the
answer (e.g. a captured decode step), it may set `step.decoder_trim = False` to skip the model's check.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ...config import ModelConfig
from ..step import StepInput
from .engram_hash import prev_ids_for_rows


def engram_history(config: ModelConfig, histories: Sequence[Sequence[int]], starts: Sequence[int],
                   lengths: Sequence[int], device: torch.device | str = "cpu") -> torch.Tensor | None:
    """`step.engram_prev_ids` for rows r = 0..R-1 of a step in order: `histories[r]` is the request's token list
    (covering at least positions [starts[r] - 3, starts[r] + lengths[r])), the row computes lengths[r] tokens from
    starts[r]. None for a model without Engram."""
    if not config.engram_layers:
        return None
    prev = prev_ids_for_rows(histories, starts, lengths, config.engram_max_ngram - 1)
    return prev.to(device, non_blocking=True)


def make_step_hook(model: torch.nn.Module, config: ModelConfig, tokenizer=None) -> Callable[..., None]:
    """The runner's `step_hook`; binds the model's Engram hashing to the serving tokenizer when one is given."""
    if tokenizer is not None and config.engram_layers and hasattr(model, "bind_tokenizer"):
        model.bind_tokenizer(getattr(tokenizer, "backend", tokenizer))

    def step_hook(sched, step: StepInput) -> None:
        rows = sched.rows
        step.engram_prev_ids = engram_history(config, [r.request.tokens for r in rows], [r.start for r in rows],
                                              [r.num_tokens for r in rows], step.device)

    return step_hook
