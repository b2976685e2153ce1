"""GPU memory kept out of the KV-cache budget (shared by the engine's start-up sizing and `v4serve info`)."""

from __future__ import annotations

from ..config import ModelConfig

GRAPHS_AND_ALLOCATOR = 2 << 30
MAX_ACTIVATIONS = 24 << 30


def activation_reserve(mc: ModelConfig, step_tokens: int) -> int:
    """An estimate of the largest step's activation memory (attention gathers, mHC streams, logits) for a step of
    `step_tokens` tokens, capped at 24 GiB, plus 2 GiB for CUDA graphs and the allocator."""
    per_token = 4 * (mc.n_heads * (mc.window_size + mc.index_topk) * 4 + mc.hc_mult * mc.dim * 8 + mc.vocab_size)
    return int(min(step_tokens * per_token * 2, MAX_ACTIVATIONS)) + GRAPHS_AND_ALLOCATOR
