"""What the engine calls for DeepSeek-V4.1: per-step extras the model cannot derive from the step itself.

Contract (`extras_fn(sched, step) -> dict`, merged into `step.extras` by the runner):
* `engram_prev_ids`: int64 [T, max_ngram - 1] on the step's device; row t holds the token ids at positions
  p-1, p-2, p-3 of token t (p = its position), -1 before the sequence start. Built from each scheduled row's
  request token list, so n-grams span chunk and decode-step boundaries. Image placeholders are passed as they are
  (the hasher treats them as dead).
The decoder trim needs no extras: the runner already sets `decoder_floor` per row (0 = exact). When it knows the
answer (e.g. a captured decode step), it may set `extras["decoder_trim"] = False` to skip the model's check.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ...config import ModelConfig
from ..step import StepInput
from .engram_hash import prev_ids_for_rows


def engram_step_extras(config: ModelConfig, histories: Sequence[Sequence[int]], starts: Sequence[int],
                       lengths: Sequence[int], device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Extras for rows r = 0..R-1 of a step in order: `histories[r]` is the request's token list (covering at
    least positions [starts[r] - 3, starts[r] + lengths[r])), the row computes lengths[r] tokens from starts[r]."""
    if not config.engram_layers:
        return {}
    prev = prev_ids_for_rows(histories, starts, lengths, config.engram_max_ngram - 1)
    return {"engram_prev_ids": prev.to(device, non_blocking=True)}


def make_extras_fn(model: torch.nn.Module, config: ModelConfig, tokenizer=None) -> Callable[..., dict]:
    """The runner's `extras_fn`; binds the model's Engram hashing to the serving tokenizer when one is given."""
    if tokenizer is not None and config.engram_layers and hasattr(model, "bind_tokenizer"):
        model.bind_tokenizer(getattr(tokenizer, "backend", tokenizer))

    def extras_fn(sched, step: StepInput) -> dict[str, torch.Tensor]:
        rows = sched.rows
        return engram_step_extras(config, [r.request.tokens for r in rows], [r.start for r in rows],
                                  [r.num_tokens for r in rows], step.device)

    return extras_fn
