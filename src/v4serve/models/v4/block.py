"""One DeepSeek-V4 block: mHC collapse -> attention -> mHC expand, then the same around the MoE."""

from __future__ import annotations

import torch
from torch import nn

from ...config import ModelConfig
from ...ops import backend as kernels
from ...ops.mhc import hc_post, hc_post_pre, hc_pre
from ..numerics import Numerics
from .attention import V4Attention
from .context import StepContext
from .modules import Norm, param
from .moe import MoE


class V4Block(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, numerics: Numerics):
        super().__init__()
        c = config
        self.config, self.layer = c, layer
        self.attn = V4Attention(c, layer, numerics)
        self.ffn = MoE(c, layer, numerics)
        self.attn_norm = Norm(c.dim, c.norm_eps)
        self.ffn_norm = Norm(c.dim, c.norm_eps)
        mix, hd = (2 + c.hc_mult) * c.hc_mult, c.hc_mult * c.dim
        self.hc_attn_fn, self.hc_attn_base, self.hc_attn_scale = param(mix, hd), param(mix), param(3)
        self.hc_ffn_fn, self.hc_ffn_base, self.hc_ffn_scale = param(mix, hd), param(mix), param(3)
        self.backend = kernels.current()

    def _hc(self, x: torch.Tensor, which: str, norm: Norm, pending: tuple | None = None
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(x, y, post, comb): coefficients from x, y = x collapsed with its own pre, then normed by `norm`. With
        `pending` = (f, post, comb) of the sub-layer before, not yet expanded into x, its expansion and this pre side
        run as one call (hc_post, then hc_pre of the new x, which is returned)."""
        c = self.config
        fn, base, scale = (getattr(self, f"hc_{which}_{p}") for p in ("fn", "base", "scale"))
        args = (fn, base, scale, c.hc_mult, c.hc_sinkhorn_iters, c.norm_eps, c.hc_eps)
        kw = {"norm_weight": norm.weight, "norm_eps2": norm.eps, "backend": self.backend}
        if pending is None:
            y, _, post, comb = hc_pre(x, *args, **kw)
            return x, y, post, comb
        x, y, _, post, comb = hc_post_pre(pending[0], x, pending[1], pending[2], *args, **kw)
        return x, y, post, comb

    def seam(self, x: torch.Tensor, ctx: StepContext, pending: tuple | None = None) -> tuple[torch.Tensor, tuple]:
        """The block with its FFN's expansion left pending: -> (x, (f, post, comb)) for the next block's `seam` (whose
        attention pre side takes it in the same call) or `expand`. `pending` is the block before's."""
        x, y, post, comb = self._hc(x, "attn", self.attn_norm, pending)
        # the attention's expansion and the FFN's pre side in one call
        x, y, post, comb = self._hc(x, "ffn", self.ffn_norm, (self.attn(y, ctx), post, comb))
        return x, (self.ffn(y, ctx.step.token_ids), post, comb)

    def expand(self, x: torch.Tensor, pending: tuple) -> torch.Tensor:
        """The streams after a pending expansion (the last block's FFN)."""
        return hc_post(pending[0], x, pending[1], pending[2], self.backend)

    def forward(self, x: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        return self.expand(*self.seam(x, ctx))
