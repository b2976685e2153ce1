"""GPU memory kept out of the KV-cache budget (shared by the engine's start-up sizing and `v4serve info`)."""

from __future__ import annotations

from ..config import ModelConfig

GRAPHS_AND_ALLOCATOR = 2 << 30
MAX_ACTIVATIONS = 24 << 30


def activation_reserve(mc: ModelConfig, step_tokens: int, local_experts: tuple[int, int] | None = None) -> int:
    """An estimate of the largest step's activation memory (attention gathers or staged KV rows, mHC streams, logits)
    for a step of `step_tokens` tokens, capped at 24 GiB, plus 2 GiB for CUDA graphs and the allocator, plus the
    routed experts' prefill working set (ops/kernels/moe_grouped.py: bf16 copies of this rank's FP4 experts,
    `local_experts` = (count, expert width) as held; default all of them whole; (0, 0) for experts not in FP4)."""
    from ..ops.kernels.attention_stage import STAGE_BUDGET
    from ..ops.kernels.moe_grouped import working_set

    attention = 4 * mc.n_heads * (mc.window_size + mc.index_topk) * 4
    per_token = attention + 4 * (mc.hc_mult * mc.dim * 8 + mc.vocab_size)
    n, inter = local_experts or (mc.n_routed_experts, mc.moe_inter_dim)
    moe = working_set(n, mc.dim, inter, step_tokens * mc.n_activated_experts) if n else 0
    # a prompt chunk's staged KV rows (ops/kernels/attention_stage.py, up to STAGE_BUDGET a launch) take the place of
    # the reference's attention gathers; small chunks' gathers are smaller than that
    staging = max(0, STAGE_BUDGET - step_tokens * attention * 2)
    return int(min(step_tokens * per_token * 2, MAX_ACTIVATIONS)) + GRAPHS_AND_ALLOCATOR + moe + staging
