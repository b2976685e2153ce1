"""DSpark draft blocks of DeepSeek-V4.1 (`mtp.0..2`): propose a block of `dspark_block_size` tokens at once.

Context. After every target step, the stream-means of the inputs of the target layers (37, 38, 39) at the step's
positions are concatenated [3 * dim] and projected: main_x = main_norm(main_proj(.)). Each stage turns main_x
into window KV rows with its own `wkv` / `kv_norm` (RoPE at the position, FP8 per 32) and keeps them in its own
window ring (cache layers n_layers + stage): `write_context`.

Draft. With `a` the position of the last token the target processed and `anchor` the token sampled there (it
sits at a + 1), the block [anchor, noise x (B-1)] at positions a+1 .. a+B is embedded and expanded to the
streams; each stage is a V4.1 block (single-pass mHC carried across stages, a 128-expert top-3 MoE) whose
attention lets every block row see the stage's context window (positions a-W+1 .. a) and all B block rows.
The last stage's collapse (with the last `pre`) is h_k; logits_k = head(norm(h_k)). Tokens are then chosen left
to right with a rank-r Markov bias of the previous token, bias = markov_head.embed[prev] @ markov_head.head^T,
and a confidence c_k = sigmoid(confidence_head.proj([h_k, markov_head.embed[prev]])).
Block row k proposes the token at position a + 2 + k.

Provenance: DeepSeek's `inference/model.py` (DSparkBlock / DSparkAttention, revision dba1be0a) as read through
public ports (ROCm/ATOM deepseek_v41/dspark.py and model_ops/deepseek_v41/dspark.py: positions, window validity,
FP8 context keys, taps at the target layers' *inputs*; ATOM's V4 DSpark heads: Markov bias and confidence on the
pre-norm collapse).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from ...cache.pool import KVPools
from ...config import ModelConfig
from ...ops.attention import sparse_attention
from ...ops.linear import Linear, linear
from ...ops.mhc import hc_collapse
from ...ops.rope import inv_freq, rope_cos_sin
from ..numerics import Numerics
from ..v4.context import StepContext
from ..v4.modules import Norm, param
from .block import V41Block, identity_pre


@dataclass
class DraftOutput:
    tokens: torch.Tensor  # [R, B] proposed tokens for positions a+2 .. a+B+1
    logits: torch.Tensor  # [R, B, vocab] float32, Markov bias included (the distributions the tokens came from)
    confidence: torch.Tensor  # [R, B] in (0, 1): estimated probability that token k survives given k-1 did


class DSparkBlock(V41Block):
    def __init__(self, config: ModelConfig, stage: int, numerics: Numerics):
        c = config
        super().__init__(c, c.n_layers + stage, numerics, c.dspark_n_routed_experts, c.dspark_n_activated_experts)
        self.stage = stage
        if stage == 0:
            self.main_proj = Linear(c.dim * len(c.dspark_target_layers), c.dim)
            self.main_norm = Norm(c.dim, c.norm_eps)
        if stage == c.n_mtp_layers - 1:
            self.norm = Norm(c.dim, c.norm_eps)
            self.markov_head = nn.Module()
            self.markov_head.embed = nn.Module()
            self.markov_head.embed.weight = param(c.vocab_size, c.dspark_markov_rank)
            self.markov_head.head = nn.Module()
            self.markov_head.head.weight = param(c.vocab_size, c.dspark_markov_rank)
            self.confidence_head = nn.Module()
            self.confidence_head.proj = Linear(c.dim + c.dspark_markov_rank, 1)

    def draft_attention(self, y: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, context: torch.Tensor,
                        context_valid: torch.Tensor, block: int) -> torch.Tensor:
        """y [R*B, D] normed block rows; context [R, W, hd] window KV, context_valid [R, W]."""
        a = self.attn
        q, _ = a.queries(y, cos, sin)
        kv = a.window_kv(y, cos, sin).view(-1, block, a.config.head_dim)  # [R, B, hd]
        keys = torch.cat([context, kv], dim=1)  # [R, W + B, hd]: every row sees the window and the whole block
        valid = torch.cat([context_valid, torch.ones_like(context_valid[:, :1]).expand(-1, block)], dim=1)
        row = torch.arange(keys.shape[0], device=y.device).repeat_interleave(block)
        o = sparse_attention(q, keys[row], valid[row], a.attn_sink, a.config.head_dim ** -0.5)
        return a.output(o, cos, sin)


class DSpark:
    """Drafting with the stages (the model's `mtp` blocks); embedding and head are the target model's."""

    def __init__(self, config: ModelConfig, stages: nn.ModuleList, dtype: torch.dtype, backend: str):
        self.config = config
        self.stages = stages
        self.dtype, self.backend = dtype, backend  # activations' dtype; the kernels' backend for the heads

    def cache_layer(self, stage: int) -> int:
        return self.config.n_layers + stage

    def has_rings(self, pools: KVPools) -> bool:
        return all(self.cache_layer(j) in pools.window for j in range(len(self.stages)))

    def write_context(self, taps: torch.Tensor, ctx: StepContext) -> None:
        """taps [T, n_targets * dim] for ctx.step's tokens -> each stage's window ring."""
        first = self.stages[0]
        main_x = first.main_norm(first.main_proj(taps.to(self.dtype)))
        cos, sin = ctx.rope(False)
        for j, stage in enumerate(self.stages):
            ctx.write_window(self.cache_layer(j), stage.attn.window_kv(main_x, cos, sin), self.backend)

    @torch.no_grad()
    def draft(self, embed: torch.Tensor, head: torch.Tensor, pools: KVPools, anchor_ids: torch.Tensor,
              anchor_pos: torch.Tensor, slots: torch.Tensor, window_floor: torch.Tensor | None = None,
              choose: Callable[[torch.Tensor], torch.Tensor] | None = None) -> DraftOutput:
        """Propose a block per row. anchor_pos [R] = position of the last token the target processed (its taps
        are in the rings); anchor_ids [R] = the token sampled there. `choose(logits [R, V]) -> ids [R]` picks
        each token (greedy argmax by default)."""
        c = self.config
        B, W, R = c.dspark_block_size, c.window_size, anchor_ids.shape[0]
        dev = anchor_ids.device
        choose = choose or (lambda lg: lg.argmax(-1))
        ids = torch.full((R, B), c.dspark_noise_token_id, dtype=torch.int64, device=dev)
        ids[:, 0] = anchor_ids
        pos = (anchor_pos.unsqueeze(1) + 1 + torch.arange(B, device=dev)).reshape(-1)
        cos, sin = rope_cos_sin(pos, inv_freq(c, False, pos.device))
        # context: each stage's ring at positions a-W+1 .. a (valid from max(0, window_floor))
        cpos = anchor_pos.unsqueeze(1) - (W - 1) + torch.arange(W, device=dev)
        floor = torch.zeros_like(anchor_pos) if window_floor is None else window_floor
        cvalid = (cpos >= 0) & (cpos >= floor.unsqueeze(1))
        crows = pools.window_rows(slots.unsqueeze(1), cpos.clamp(min=0))
        x = embed[ids.reshape(-1)].to(self.dtype)
        x = x.unsqueeze(1).expand(-1, c.hc_mult, -1).contiguous()
        pre = identity_pre(x)
        image = torch.zeros(R * B, dtype=torch.bool, device=dev)
        for j, stage in enumerate(self.stages):
            context = pools.window[self.cache_layer(j)].read(crows, x.dtype)  # [R, W, hd]
            x, pre = stage.ffn_part(stage.attn_part(
                x, pre, lambda y, s=stage, ctx=context: s.draft_attention(y, cos, sin, ctx, cvalid, B)), image)
        last = self.stages[-1]
        h = hc_collapse(x, pre)  # [R*B, D] pre-norm: the confidence head's input
        base = linear(last.norm(h).float(), head, None, 0, 0, self.backend).view(R, B, -1)
        return self._choose_block(last, h.view(R, B, -1), base, anchor_ids, choose)

    def _choose_block(self, last: DSparkBlock, h: torch.Tensor, base: torch.Tensor, anchor: torch.Tensor,
                      choose: Callable[[torch.Tensor], torch.Tensor]) -> DraftOutput:
        mk_embed, mk_head = last.markov_head.embed.weight, last.markov_head.head.weight
        prev = anchor
        toks, logits, conf = [], [], []
        for k in range(base.shape[1]):  # left to right: each token's bias depends on the one before
            e = mk_embed[prev].float()
            lg = base[:, k] + linear(e, mk_head, None, 0, 0, self.backend)
            nxt = choose(lg)
            c_in = torch.cat([h[:, k].float(), e], dim=-1)
            conf.append(torch.sigmoid(last.confidence_head.proj(c_in.to(self.dtype))
                                      .float().squeeze(-1)))
            toks.append(nxt)
            logits.append(lg)
            prev = nxt
        return DraftOutput(torch.stack(toks, 1), torch.stack(logits, 1), torch.stack(conf, 1))
