"""DeepSeek-V4 attention: low-rank queries, one shared K=V head, a sliding window on every layer, and on
compressed layers a compressor (CSA ratio 4 with overlap and a lightning indexer, HCA dense over its entries).
"""

from __future__ import annotations

import torch
from torch import nn

from ...config import ModelConfig
from ...ops import compressor as comp
from ...ops import quant
from ...dist import parallel
from ...ops import backend
from ...ops.attention import attend
from ...ops.hadamard import hadamard_rotate
from ...ops.indexer import index_topk
from ...ops.linear import Linear
from ...ops.norm import rms_norm
from ...ops.precision import acc_dtype, wide
from ...ops.profiling import family
from ...ops.rope import apply_rope
from ..numerics import Numerics
from .context import StepContext
from .modules import CompressorParams, Norm, param


def simulate(x: torch.Tensor, fmt: str | None, rope_dim: int) -> torch.Tensor:
    """The reference's quant-dequant of cached rows (V4: FP8 on the nope dims, per 64)."""
    if fmt is None:
        return x
    if fmt == "v4_fp8":
        # the rope dims stay BF16 (the reference's KV dtype, and what the 584-B record stores)
        nope = x.shape[-1] - rope_dim
        rope = x[..., nope:].to(torch.bfloat16).to(x.dtype)
        return torch.cat([quant.fp8_simulate(x[..., :nope], 64), rope], dim=-1)
    if fmt == "fp8_b32":
        return quant.fp8_simulate(x, 32)
    if fmt == "nvfp4":
        return quant.fp4_simulate(x, 16, "e4m3")
    raise ValueError(fmt)


def run_compressor(p: CompressorParams, x: torch.Tensor, ctx: StepContext, layer: int, state, write_pool,
                   finish) -> None:
    """Project, pool completed groups, finish them (norm / RoPE / simulation) and store; update the state."""
    step = ctx.step
    xf = x.to(acc_dtype(x))
    kv = p.wkv(xf)
    if p.wgate is not None:
        score = p.wgate(xf)
        if p.ape is not None:
            score = score + p.ape[step.positions % p.ratio]
    else:
        score = torch.zeros_like(kv)
    if p.ratio == 1 and p.wgate is None:  # V4.1 ratio-1 source: the entry is each position itself
        groups = comp.Groups(step.token_row, step.positions, torch.ones_like(step.positions, dtype=torch.bool))
        pooled = kv
    else:
        src = comp.PositionSource(step, p.ratio, p.overlap)
        kv_src, score_src = src.table(state.kv, state.score, kv, score)
        groups = comp.completed_groups(step, p.ratio)
        pooled = comp.pool_entries(kv_src, score_src, src, groups, p.head_dim)
        new_kv, new_score = comp.next_state(kv_src, score_src, src)
        state.kv[step.row_slot] = new_kv
        state.score[step.row_slot] = new_score
    entries = finish(rms_norm(pooled.to(x.dtype), p.norm.weight, p.norm.eps), groups.entry * p.ratio)
    write_pool.write(ctx.entry_write_rows(layer, groups.row, groups.entry, groups.valid), entries)



def add_projections(m: nn.Module, c: ModelConfig) -> None:
    """The per-layer projections of every DeepSeek-V4-family attention (names as in the checkpoints)."""
    H, hd = c.n_heads, c.head_dim
    m.wq_a = Linear(c.dim, c.q_lora_rank)
    m.q_norm = Norm(c.q_lora_rank, c.norm_eps)
    m.wq_b = Linear(c.q_lora_rank, H * hd)
    m.wkv = Linear(c.dim, hd)
    m.kv_norm = Norm(hd, c.norm_eps)
    m.wo_a = Linear(H * hd // c.o_groups, c.o_groups * c.o_lora_rank)
    m.wo_b = Linear(c.o_groups * c.o_lora_rank, c.dim)
    m.attn_sink = param(H)


class V4Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, numerics: Numerics):
        super().__init__()
        c = config
        self.config, self.layer, self.numerics = c, layer, numerics
        self.ratio = c.compress_ratios[layer]
        self.is_trunk = layer < c.n_layers
        hd = c.head_dim
        add_projections(self, c)
        self.compressor: CompressorParams | None = None
        self.indexer: nn.Module | None = None
        if self.ratio and self.is_trunk:
            self.compressor = CompressorParams(c.dim, hd, self.ratio, self.ratio == 4, True, True, c.norm_eps)
            if self.ratio == 4:
                self.indexer = nn.Module()
                self.indexer.wq_b = Linear(c.q_lora_rank, c.index_n_heads * c.index_head_dim)
                self.indexer.weights_proj = Linear(c.dim, c.index_n_heads)
                self.indexer.compressor = CompressorParams(c.dim, c.index_head_dim, 4, True, True, True, c.norm_eps)
        else:
            self.ratio = 0  # MTP blocks attend over their window only
        self.backend = backend.current()
        self.tp = parallel.current()

    # ------------------------------------------------------------------------------------------------
    def _finish_entry(self, rows: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        cos, sin = self._entry_rope(pos)
        return simulate(apply_rope(rows, cos, sin), self.numerics.compressed_kv, self.config.rope_dim)

    def _finish_index_key(self, rows: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        cos, sin = self._entry_rope(pos)
        return self._index_format(apply_rope(rows, cos, sin))

    def _entry_rope(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        from ...ops.rope import inv_freq, rope_cos_sin

        return rope_cos_sin(pos, inv_freq(self.config, True, pos.device))

    def _index_format(self, x: torch.Tensor) -> torch.Tensor:
        if self.numerics.index_rotate:
            x = hadamard_rotate(x)
        if self.numerics.index_fp4:
            x = quant.fp4_simulate(x, 32)
        return x

    def forward(self, x: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        c, step, pools = self.config, ctx.step, ctx.pools
        T, H, hd = step.num_tokens, c.n_heads, c.head_dim
        cos, sin = ctx.rope(self.ratio > 0)
        qr = self.q_norm(self.wq_a(x))
        q = self.wq_b(qr).view(T, H, hd)  # normalised per head and rotated inside the attention
        kv = apply_rope(self.kv_norm(self.wkv(x)), cos, sin)
        kv = simulate(kv, self.numerics.window_kv, c.rope_dim)

        entries = None
        if self.ratio:
            L = self.layer
            with family("compressor"):
                run_compressor(self.compressor, x, ctx, L, pools.state[L], pools.compressed[L], self._finish_entry)
            visible = ctx.visible(self.ratio)
            if self.indexer is None:  # HCA: every visible entry
                entries = ctx.entry_refs(L)
            else:
                with family("indexer"):
                    idx = self._select(x, qr, ctx, visible)
                entries = ctx.entry_refs(L, picks=idx)
        with family("attention"):
            o = attend(q, cos, sin, kv, self.attn_sink, hd ** -0.5, c.norm_eps, ctx.window_refs(self.layer), entries,
                       self.backend)
            ctx.write_window(self.layer, kv)
        o = self.wo_a.grouped(o.reshape(T, c.o_groups, -1))  # [T, g, o_lora_rank]
        return self.tp.all_reduce(self.wo_b(o.flatten(1)))  # row-parallel under TP: sum the ranks' heads

    def _select(self, x: torch.Tensor, qr: torch.Tensor, ctx: StepContext, visible: torch.Tensor) -> torch.Tensor:
        """The indexer: write this step's index keys, score every visible key, keep the top-k (the keys are read
        from the pool, paged and in their stored format, by ops.indexer.index_topk)."""
        c, step, pools, L = self.config, ctx.step, ctx.pools, self.layer
        ix = self.indexer
        with family("compressor"):
            run_compressor(ix.compressor, x, ctx, L, pools.index_state[L], pools.index_keys[L],
                           self._finish_index_key)
        T = step.num_tokens
        cos, sin = ctx.rope(True)
        qi = ix.wq_b(qr).view(T, c.index_n_heads, c.index_head_dim)
        qi = self._index_format(apply_rope(qi, cos.unsqueeze(1), sin.unsqueeze(1)))
        w = wide(ix.weights_proj(x)) * (c.index_head_dim ** -0.5 * c.index_n_heads ** -0.5)
        entries = ctx.index_entries(L, visible)
        return index_topk(qi, w, pools.index_keys[L], entries, c.index_topk, backend=self.backend)[0]
