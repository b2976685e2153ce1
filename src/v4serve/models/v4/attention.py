"""DeepSeek-V4 attention: low-rank queries, one shared K=V head, a sliding window on every layer, and on
compressed layers a compressor (CSA ratio 4 with overlap and a lightning indexer, HCA dense over its entries).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ...config import ModelConfig
from ...ops import compressor as comp
from ...dist import parallel
from ...ops import backend, streams
from ...ops.attention import attend
from ...ops.finish import finish_rows
from ...ops.indexer import index_topk
from ...ops.linear import Linear, RowStack
from ...ops.shard import COLUMN, ROW
from ...ops.peer_sum import PartialSum
from ...ops.precision import acc_dtype
from ...ops.profiling import family
from ..numerics import Numerics
from .context import StepContext
from .modules import CompressorParams, Norm, compressor_linears, param, split_projections


def run_compressor(p: CompressorParams, kv: torch.Tensor, score: torch.Tensor | None, out_dtype: torch.dtype,
                   ctx: StepContext, layer: int, state, write_pool, rotate: bool, fmt: str | None, rope_dim: int,
                   backend: str) -> None:
    """From this step's projections (`kv`, `score`: x widened to the accumulation dtype through wkv and wgate; None
    for an ungated compressor), pool the completed groups (carrying the partial group in `state`) into `out_dtype`,
    finish them (norm, RoPE at the group's first position, [Hadamard,] the format's simulation) and store them in
    their paged rows."""
    score = score if score is not None else torch.zeros_like(kv)
    plan = ctx.compression(p.ratio)
    pooled = comp.pool_groups(kv, score, p.ape, ctx.step, plan.groups, state.kv, state.score, p.ratio, p.overlap,
                              p.head_dim, out_dtype, backend)
    finish_rows(pooled, p.norm.weight, p.norm.eps, plan.cos, plan.sin, rotate, fmt, rope_dim, write_pool, plan.rows,
                backend)


def add_projections(m: nn.Module, c: ModelConfig) -> None:
    """The per-layer projections of every DeepSeek-V4-family attention (names as in the checkpoints)."""
    H, hd = c.n_heads, c.head_dim
    m.wq_a = Linear(c.dim, c.q_lora_rank)
    m.q_norm = Norm(c.q_lora_rank, c.norm_eps)
    m.wq_b = Linear(c.q_lora_rank, H * hd, shard=COLUMN)  # TP: by query head
    m.wkv = Linear(c.dim, hd)
    m.kv_norm = Norm(hd, c.norm_eps)
    m.wo_a = Linear(H * hd // c.o_groups, c.o_groups * c.o_lora_rank, shard=COLUMN)  # by output group
    m.wo_b = Linear(c.o_groups * c.o_lora_rank, c.dim, shard=ROW)  # its output all-reduced
    m.attn_sink = param(H)
    m.shard_rules = {"attn_sink": COLUMN}  # one logit per query head


class V4Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, numerics: Numerics):
        super().__init__()
        c = config
        self.config, self.layer, self.numerics = c, layer, numerics
        self.ratio = c.compress_ratios[layer]
        self.is_trunk = layer < c.n_layers
        hd = c.head_dim
        add_projections(self, c)
        self.qkv_a = RowStack([self.wq_a, self.wkv])  # both project x: one GEMM once stacked
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
        # a CSA layer's two compressors (a HCA layer's one) and the indexer's head weights project the same x: one GEMM
        # once stacked (float32 sums; the head weights are rounded to x's dtype after, as their own bf16 linear)
        self.compressors = [m for m in (self.compressor, getattr(self.indexer, "compressor", None)) if m is not None]
        heads = [self.indexer.weights_proj] if self.indexer is not None else []
        self.compress_proj = RowStack(compressor_linears(*self.compressors) + heads)
        self.backend = backend.current()
        self.tp = parallel.current()

    # ------------------------------------------------------------------------------------------------
    def _index_fmt(self) -> str | None:
        return "mxfp4" if self.numerics.index_fp4 else None

    def forward(self, x: torch.Tensor, ctx: StepContext) -> torch.Tensor | PartialSum:
        c, step, pools = self.config, ctx.step, ctx.pools
        T, H, hd = step.num_tokens, c.n_heads, c.head_dim
        cos, sin = ctx.rope(self.ratio > 0)
        qa, kva = self.qkv_a(x)
        qr, q_in = self.q_norm.feeding(qa, self.wq_b)  # q_in: qr, or qr quantized for wq_b by the norm (norm_quant)
        # side-stream overlaps (ops/streams.py), in the order the main stream needs their results: the index queries
        # (indexer_query) beside the KV finish and the compressors, then the queries (attention_query; normalised per
        # head and rotated inside the attention) beside those and the indexer
        qi_of = (streams.beside("indexer_query", x, lambda: self._index_query(qr, ctx))
                 if self.indexer is not None else None)
        q_of = streams.beside("attention_query", x, lambda: self.wq_b(q_in))
        store = ctx.early_window_store(self.layer)  # decode steps with early_window: the rows stored by their finish
        kv = finish_rows(kva, self.kv_norm.weight, c.norm_eps, cos, sin, False, self.numerics.window_kv,
                         c.rope_dim, *store, backend=self.backend)

        entries = None
        if self.ratio:
            L = self.layer
            # the compressors project x in float32 (x widened by the GEMM: exact bf16 products, float32 sums), one
            # GEMM for both of a CSA layer's compressors
            outs = self.compress_proj(x, acc_dtype(x))
            projs = split_projections(outs, *self.compressors)
            with family("compressor"):
                run_compressor(self.compressor, *projs[0], x.dtype, ctx, L, pools.state[L], pools.compressed[L],
                               False, self.numerics.compressed_kv, c.rope_dim, self.backend)
            visible = ctx.visible(self.ratio)
            if self.indexer is None:  # HCA: every visible entry
                entries = ctx.entry_refs(L)
            else:
                with family("indexer"):
                    idx = self._select(x, projs[1], outs[-1], qi_of, ctx, visible)
                entries = ctx.entry_refs(L, picks=idx)
        with family("attention"):
            o = attend(q_of().view(T, H, hd), cos, sin, kv, self.attn_sink, hd ** -0.5, c.norm_eps,
                       ctx.window_refs(self.layer), entries, self.backend)
            if store[0] is None:
                ctx.write_window(self.layer, kv, self.backend)
        # [T, g, o_lora_rank] (quantized for wo_b by wo_a's launch with gemv_quant_out)
        o = self.wo_a.grouped(o.reshape(T, c.o_groups, -1), quant_out=self.wo_b.act_group)
        return self.tp.all_reduce(self.wo_b(o.flatten(1)), defer=True)  # row-parallel under TP: the ranks' heads

    def _index_query(self, qr: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """The indexer's queries [T, index heads, index head dim] from the q latent: projected, rotated and stored in
        the index keys' format (read only by index_topk; no pool is written)."""
        c, ix = self.config, self.indexer
        with family("indexer"):
            cos, sin = ctx.rope(True)
            return finish_rows(ix.wq_b(qr).view(qr.shape[0], c.index_n_heads, c.index_head_dim), None, 0.0, cos, sin,
                               self.numerics.index_rotate, self._index_fmt(), 0, backend=self.backend)

    def _select(self, x: torch.Tensor, proj: tuple[torch.Tensor, torch.Tensor | None], head_sums: torch.Tensor,
                qi_of: Callable[[], torch.Tensor], ctx: StepContext, visible: torch.Tensor) -> torch.Tensor:
        """The indexer: write this step's index keys, score every visible key, keep the top-k (the keys are read
        from the pool, paged and in their stored format, by ops.indexer.index_topk). proj: its compressor's (kv,
        score) projections of x; head_sums: weights_proj's float32 sums (from the same stacked GEMM); qi_of: the
        index queries' getter (_index_query, perhaps run beside)."""
        c, pools, L = self.config, ctx.pools, self.layer
        ix = self.indexer
        with family("compressor"):
            run_compressor(ix.compressor, *proj, x.dtype, ctx, L, pools.index_state[L], pools.index_keys[L],
                           self.numerics.index_rotate, self._index_fmt(), 0, self.backend)
        entries = ctx.index_entries(L, visible)
        # weights_proj(x) rounded to x's dtype (as its own linear would be) and scaled, both as the kernel loads it
        return index_topk(qi_of(), head_sums, pools.index_keys[L], entries, c.index_topk,
                          w_scale=c.index_head_dim ** -0.5 * c.index_n_heads ** -0.5, w_dtype=x.dtype,
                          backend=self.backend)[0]
