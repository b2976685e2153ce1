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

    def _hc(self, x: torch.Tensor, which: str, norm: Norm) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(y, post, comb): coefficients from x, y = x collapsed with its own pre, then normed by `norm`."""
        c = self.config
        y, _, post, comb = hc_pre(x, getattr(self, f"hc_{which}_fn"), getattr(self, f"hc_{which}_base"),
                                  getattr(self, f"hc_{which}_scale"), c.hc_mult, c.hc_sinkhorn_iters, c.norm_eps,
                                  c.hc_eps, norm_weight=norm.weight, norm_eps2=norm.eps, backend=self.backend)
        return y, post, comb

    def forward(self, x: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        c = self.config
        y, post, comb = self._hc(x, "attn", self.attn_norm)
        # the attention's expansion and the FFN's pre side in one call (hc_post, then _hc(x, "ffn", ffn_norm))
        x, y, _, post, comb = hc_post_pre(self.attn(y, ctx), x, post, comb, self.hc_ffn_fn, self.hc_ffn_base,
                                          self.hc_ffn_scale, c.hc_mult, c.hc_sinkhorn_iters, c.norm_eps, c.hc_eps,
                                          norm_weight=self.ffn_norm.weight, norm_eps2=self.ffn_norm.eps,
                                          backend=self.backend)
        return hc_post(self.ffn(y, ctx.step.token_ids), x, post, comb, self.backend)
