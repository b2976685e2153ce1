"""DeepSeek-V4.1 attention: V4's low-rank queries / single K=V head / window / sink / grouped output, with CSA2.

Per layer: its own q path (no per-head query norm in V4.1), its own 128-position window KV (the whole 512-vector
FP8-simulated per 32 after RoPE), its own sink and output projection. On layers with a nonzero ratio, the
query also attends to up to `index_topk` compressed entries of the most recent *KV source*:
* KV sources run the CSA2 compressor (ratio 2: gated pooling of 2 positions; ratio 1: one entry per position,
  ungated; no overlap, no APE). Its latent (RMS-normed, before RoPE) gives both the compressed entry (RoPE at
  the group's first position, NVFP4-simulated) and the index key (`wk`, `k_norm`, RoPE, MXFP4-simulated).
* index sources score and select (indexer.py); the other layers reuse the last index source's selection.
Under tensor parallelism a rank holds its query heads, sinks and wo_a groups (rank_config) and sums `wo_b`'s partial
outputs over the ranks; the window KV, the compressors, the index keys and the indexer are replicated (every rank
computes the same selection), as V4's single KV head and compressors are (models/sharding.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ...cache.pool import RowPool
from ...config import ModelConfig
from ...dist import parallel
from ...ops import backend, streams
from ...ops import compressor as comp
from ...ops.attention import EntryRefs, attend
from ...ops.finish import finish_rows
from ...ops.indexer import index_topk
from ...ops.linear import Linear, RowStack
from ...ops.peer_sum import PartialSum
from ...ops.precision import acc_dtype
from ...ops.profiling import family
from ...ops.rope import apply_rope
from ..numerics import Numerics
from ..v4.attention import add_projections
from ..v4.context import StepContext
from ..v4.modules import CompressorParams, Norm, compressor_linears, split_projections
from .indexer import Selection


class V41Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, numerics: Numerics):
        super().__init__()
        c = config
        self.config, self.layer, self.numerics = c, layer, numerics
        is_trunk = layer < c.n_layers
        self.ratio = c.compress_ratios[layer] if is_trunk else 0  # DSpark blocks are window-only
        add_projections(self, c)
        self.qkv_a = RowStack([self.wq_a, self.wkv])  # both project x: one GEMM once stacked (forward)
        hd = c.head_dim
        self.source = c.kv_source(layer) if self.ratio else -1
        self.compressor: CompressorParams | None = None
        self.indexer: nn.Module | None = None
        if self.ratio and c.owns_compressor(layer):
            self.compressor = CompressorParams(c.dim, hd, self.ratio, overlap=False, gated=self.ratio > 1,
                                               ape=False, eps=c.norm_eps)
        if self.ratio and c.runs_indexer(layer):
            self.indexer = nn.Module()
            self.indexer.wq_b = Linear(c.q_lora_rank, c.index_n_heads * c.index_head_dim)
            self.indexer.weights_proj = Linear(c.dim, c.index_n_heads)
            if self.compressor is not None:
                self.indexer.wk = Linear(hd, c.index_head_dim)
                self.indexer.k_norm = Norm(c.index_head_dim, c.norm_eps)
        self.compress_proj = RowStack(compressor_linears(self.compressor) if self.compressor is not None else [])
        cand = c.candidate_source_layer
        self.publishes_candidates = self.indexer is not None and layer == cand
        self.uses_candidates = self.indexer is not None and 0 <= cand < layer
        self.backend = backend.current()
        self.tp = parallel.current()

    # --- the shared pieces (also used by DSpark blocks) -----------------------------------------------
    def project_queries(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Queries [T, H, hd] before RoPE (V4.1 has no per-head query norm) and the q latent."""
        qr, q_in = self.q_norm.feeding(self.wq_a(x), self.wq_b)
        return self._heads(self.wq_b(q_in)), qr

    def _heads(self, q: torch.Tensor) -> torch.Tensor:
        """wq_b's output [T, H * hd] as [T, H, hd]."""
        return q.view(q.shape[0], self.config.n_heads, self.config.head_dim)

    def queries(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, qr = self.project_queries(x)
        return apply_rope(q, cos.unsqueeze(1), sin.unsqueeze(1)), qr

    def window_kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return self._window_kv_from(self.wkv(x), cos, sin)

    def _window_kv_from(self, kva: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pool: RowPool | None = None,
                        rows: torch.Tensor | None = None) -> torch.Tensor:
        """The finished window rows (stored at `rows` of `pool` too, when given)."""
        c = self.config
        return finish_rows(kva, self.kv_norm.weight, c.norm_eps, cos, sin, False, self.numerics.window_kv,
                           c.rope_dim, pool, rows, backend=self.backend)

    def project_output(self, o: torch.Tensor) -> torch.Tensor | PartialSum:
        """The grouped output projection of attention outputs already rotated back."""
        c = self.config
        # [T, g, o_lora_rank] (quantized for wo_b by wo_a's launch with gemv_quant_out)
        o = self.wo_a.grouped(o.reshape(o.shape[0], c.o_groups, -1), quant_out=self.wo_b.act_group)
        return self.tp.all_reduce(self.wo_b(o.flatten(1)), defer=True)  # row-parallel under TP: the ranks' heads

    def output(self, o: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor | PartialSum:
        return self.project_output(apply_rope(o, cos.unsqueeze(1), sin.unsqueeze(1), inverse=True))

    # --- forward ---------------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, ctx: StepContext, sel: Selection) -> torch.Tensor | PartialSum:
        cos, sin = ctx.rope(self.ratio > 0)
        qa, kva = self.qkv_a(x)  # wq_a and wkv
        # side-stream overlaps (ops/streams.py), in the order the main stream needs their results: the index queries
        # and head weights (indexer_query) beside the KV finish and the compressor, then the queries (attention_query;
        # rotated inside the attention) beside those and the indexer
        qr, q_in = self.q_norm.feeding(qa, self.wq_b)  # q_in: qr, or qr quantized for wq_b by the norm (norm_quant)
        # (default off here: their GPU check on V4.1, tests/gpu/test_cuda.py, has not run yet; on for V4)
        index_of = (streams.beside("indexer_query", x, lambda: self._index_query(x, qr, ctx), default=False)
                    if self.ratio and self.indexer is not None else None)
        q_of = streams.beside("attention_query", x, lambda: self.wq_b(q_in), default=False)
        store = ctx.early_window_store(self.layer)  # decode steps with early_window: the rows stored by their finish
        kv = self._window_kv_from(kva, cos, sin, *store)
        entries = None
        if self.ratio:
            if self.compressor is not None:
                with family("compressor"):
                    self.compress(x, ctx)
            if self.indexer is not None:
                with family("indexer"):
                    self.select(index_of, ctx, sel)
            entries = self.entries(ctx, sel)
        with family("attention"):
            o = attend(self._heads(q_of()), cos, sin, kv, self.attn_sink, self.config.head_dim ** -0.5, None,
                       ctx.window_refs(self.layer), entries, self.backend)
            if store[0] is None:
                ctx.write_window(self.layer, kv, self.backend)
        return self.project_output(o)

    def entries(self, ctx: StepContext, sel: Selection) -> EntryRefs:
        """The selected entries of the KV source's cache each token attends to."""
        return ctx.entry_refs(self.source, picks=sel.topk)

    def compress(self, x: torch.Tensor, ctx: StepContext) -> None:
        """CSA2 compressor of a KV source: write the groups completed in this step (entries and index keys)."""
        p, step, pools, L, c = self.compressor, ctx.step, ctx.pools, self.layer, self.config
        (kv, score), = split_projections(self.compress_proj(x, acc_dtype(x)), p)  # wkv and wgate in one GEMM
        plan = ctx.compression(p.ratio)
        if score is None:  # ratio 1: every position is its own entry
            pooled = kv.to(x.dtype)
        else:
            state = pools.state[L]
            pooled = comp.pool_groups(kv, score, None, step, plan.groups, state.kv, state.score, p.ratio,
                                      False, p.head_dim, x.dtype, self.backend)
        latent = finish_rows(pooled, p.norm.weight, p.norm.eps, None, None, False, None, 0, backend=self.backend)
        finish_rows(latent, None, 0.0, plan.cos, plan.sin, False, self.numerics.compressed_kv, c.rope_dim,
                    pools.compressed[L], plan.rows, self.backend)
        ix = self.indexer
        finish_rows(ix.wk(latent, acc_dtype(latent)).to(x.dtype), ix.k_norm.weight, ix.k_norm.eps, plan.cos, plan.sin,
                    False, self._index_fmt(), 0, pools.index_keys[L], plan.rows, self.backend)

    def _index_fmt(self) -> str | None:
        return "mxfp4" if self.numerics.index_fp4 else None

    def _index_query(self, x: torch.Tensor, qr: torch.Tensor, ctx: StepContext) -> tuple[torch.Tensor, torch.Tensor]:
        """The indexer's queries (projected, rotated, in the index keys' format; no pool is written) and its head
        weights weights_proj(x) in x's dtype (their scale is applied as the indexer's kernel loads them)."""
        c, ix = self.config, self.indexer
        with family("indexer"):
            cos, sin = ctx.rope(True)
            qi = finish_rows(ix.wq_b(qr).view(qr.shape[0], c.index_n_heads, c.index_head_dim), None, 0.0, cos, sin,
                             False, self._index_fmt(), 0, backend=self.backend)
            return qi, ix.weights_proj(x)

    def select(self, index_of: Callable[[], tuple[torch.Tensor, torch.Tensor]], ctx: StepContext,
               sel: Selection) -> None:
        """Score the KV source's index keys, (publish candidate blocks,) keep the top-k (ops.indexer.index_topk).
        index_of: the getter of _index_query's result (perhaps run beside)."""
        c = self.config
        if self.uses_candidates and sel.blocks is None:
            raise RuntimeError(f"layer {self.layer} masks to candidate blocks, but layer "
                               f"{c.candidate_source_layer} published none in this step")
        entries = ctx.index_entries(self.source, ctx.visible(self.ratio))
        qi, w = index_of()
        sel.topk, blocks = index_topk(qi, w, ctx.pools.index_keys[self.source], entries, c.index_topk,
                                      candidates=sel.blocks if self.uses_candidates else None,
                                      publish=c.candidate_topk_blocks if self.publishes_candidates else 0,
                                      block=c.candidate_block_size,
                                      w_scale=c.index_head_dim ** -0.5 * c.index_n_heads ** -0.5, backend=self.backend)
        if blocks is not None:
            sel.blocks = blocks
