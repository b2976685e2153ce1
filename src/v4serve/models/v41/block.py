"""One DeepSeek-V4.1 block: (Engram) -> attention -> MoE, on the 4-stream residual with single-pass mHC.

Single-pass ("lagged") mHC: every sub-layer computes (pre, post, comb) from its own input streams and uses
post / comb for its own expansion, but its input is collapsed with the `pre` of the *previous* sub-layer:
attention with the previous block's FFN `pre` (a one-hot on stream 0 before block 0), the FFN with this block's
attention `pre`. The block returns its FFN `pre` for the next one (and for the final collapse).
MoE: bias-routed everywhere (`bias`, or `bias_vl` for image-placeholder tokens), routing weights normalised with
+1e-20, the shared expert SwiGLU-clamped like the routed ones.
"""

from __future__ import annotations

import torch
from torch import nn

from ...config import ModelConfig
from ...ops import backend as kernels
from ...ops.mhc import hc_post, hc_post_pre, hc_pre
from ...ops.router import route
from ..numerics import Numerics
from ..v4.context import StepContext
from ..v4.modules import Norm, param
from ..v4.moe import MoE
from .attention import V41Attention
from .engram import Engram
from .indexer import Selection


class V41MoE(MoE):
    def __init__(self, config: ModelConfig, layer: int, numerics: Numerics, n_experts: int | None = None,
                 topk: int | None = None):
        super().__init__(config, layer, numerics, n_experts, topk)
        self.gate.bias_vl = param(self.n_experts)

    def forward(self, x: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        c, nm = self.config, self.numerics
        g = self.gate
        # image tokens select with bias_vl (selection only), chosen per token inside the router
        xq = self.simulated_input(x)
        weights, ids = route(x, g.weight, g.bias, None, None, self.topk, c.score_func, c.route_scale, nm.gate_eps,
                             c.norm_topk_prob, self.backend, alt_bias=g.bias_vl, alt=image, xq=xq,
                             quant_group=self._act_group())
        return self.combine(x, weights, ids, xq)


class V41Block(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, numerics: Numerics, n_experts: int | None = None,
                 topk: int | None = None):
        super().__init__()
        c = config
        self.config, self.layer = c, layer
        self.attn = V41Attention(c, layer, numerics)
        self.ffn = V41MoE(c, layer, numerics, n_experts, topk)
        self.attn_norm = Norm(c.dim, c.norm_eps)
        self.ffn_norm = Norm(c.dim, c.norm_eps)
        mix, hd = (2 + c.hc_mult) * c.hc_mult, c.hc_mult * c.dim
        self.hc_attn_fn, self.hc_attn_base, self.hc_attn_scale = param(mix, hd), param(mix), param(3)
        self.hc_ffn_fn, self.hc_ffn_base, self.hc_ffn_scale = param(mix, hd), param(mix), param(3)
        is_engram = layer < c.n_layers and layer in c.engram_layers
        self.engram = Engram(c, layer) if is_engram else None
        self.backend = kernels.current()

    def mhc_pre(self, x: torch.Tensor, which: str, collapse_pre: torch.Tensor | None = None,
                norm: Norm | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(y, pre, post, comb) of sub-layer `which` on x: y collapses x with `collapse_pre` (the lagged pre), then
        is normed by `norm` when given."""
        c = self.config
        return hc_pre(x, getattr(self, f"hc_{which}_fn"), getattr(self, f"hc_{which}_base"),
                      getattr(self, f"hc_{which}_scale"), c.hc_mult, c.hc_sinkhorn_iters, c.norm_eps, c.hc_eps,
                      collapse_pre, norm.weight if norm is not None else None, norm.eps if norm is not None else None,
                      backend=self.backend)

    def coefficients(self, x: torch.Tensor, which: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(pre, post, comb) alone (tests re-state the block with them)."""
        return self.mhc_pre(x, which)[1:]

    def forward(self, x: torch.Tensor, pre: torch.Tensor, ctx: StepContext, sel: Selection,
                image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, hc, D] (Engram already applied), pre [T, hc] of the previous sub-layer -> (x', this FFN's pre)."""
        x, pending, pre_f = self.seam(x, pre, ctx, sel, image)
        return self.expand(x, pending), pre_f

    def seam(self, x: torch.Tensor, pre: torch.Tensor, ctx: StepContext, sel: Selection, image: torch.Tensor,
             pending: tuple | None = None) -> tuple[torch.Tensor, tuple, torch.Tensor]:
        """The block with its FFN's expansion left pending -> (x, (f, post, comb), this FFN's pre), for the next
        block's `seam` (whose attention pre side takes it in the same call) or `expand`. `pending`: the block
        before's, not yet expanded into x."""
        return self.ffn_seam(self.attn_part(x, pre, lambda y: self.attn(y, ctx, sel), pending), image)

    def expand(self, x: torch.Tensor, pending: tuple) -> torch.Tensor:
        """The streams after a pending expansion (f, post, comb)."""
        return hc_post(pending[0], x, pending[1], pending[2], self.backend)

    def attn_part(self, x: torch.Tensor, pre: torch.Tensor, attn, pending: tuple | None = None
                  ) -> tuple[tuple, torch.Tensor]:
        """-> (the attention's expansion, pending: (its output, x, post, comb)), the attention's pre). With `pending`
        (the sub-layer before's (f, post, comb), not yet in x), its expansion and this pre side run as one call."""
        if pending is None:
            y, pre_a, post, comb = self.mhc_pre(x, "attn", pre, self.attn_norm)
        else:
            c = self.config
            x, y, pre_a, post, comb = hc_post_pre(pending[0], x, pending[1], pending[2], self.hc_attn_fn,
                                                  self.hc_attn_base, self.hc_attn_scale, c.hc_mult,
                                                  c.hc_sinkhorn_iters, c.norm_eps, c.hc_eps, pre,
                                                  self.attn_norm.weight, self.attn_norm.eps, backend=self.backend)
        return (attn(y), x, post, comb), pre_a

    def ffn_part(self, state: tuple[tuple, torch.Tensor], image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`ffn_seam` with the FFN's expansion applied -> (x', the FFN's pre)."""
        x, pending, pre_f = self.ffn_seam(state, image)
        return self.expand(x, pending), pre_f

    def ffn_seam(self, state: tuple[tuple, torch.Tensor], image: torch.Tensor
                 ) -> tuple[torch.Tensor, tuple, torch.Tensor]:
        """The attention's expansion and the FFN's pre side in one call (hc_post, then mhc_pre(x, "ffn", pre_a,
        ffn_norm)), the FFN -> (x, its pending expansion (f, post, comb), the FFN's pre)."""
        (f, x, post, comb), pre_a = state
        c = self.config
        x, y, pre_f, post, comb = hc_post_pre(f, x, post, comb, self.hc_ffn_fn, self.hc_ffn_base, self.hc_ffn_scale,
                                              c.hc_mult, c.hc_sinkhorn_iters, c.norm_eps, c.hc_eps, pre_a,
                                              self.ffn_norm.weight, self.ffn_norm.eps, backend=self.backend)
        return x, (self.ffn(y, image), post, comb), pre_f


def identity_pre(x: torch.Tensor) -> torch.Tensor:
    """The one-hot `pre` (stream 0) that the first sub-layer collapses with."""
    pre = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32, device=x.device)
    pre[:, 0] = 1.0
    return pre
