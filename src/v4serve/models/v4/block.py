"""One DeepSeek-V4 block: mHC collapse -> attention -> mHC expand, then the same around the MoE."""

from __future__ import annotations

import torch
from torch import nn

from ...config import ModelConfig
from ...ops.mhc import HCParams, hc_coefficients, hc_collapse, hc_expand, hc_mixes
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

    def _hc(self, x: torch.Tensor, which: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        c = self.config
        p = HCParams(getattr(self, f"hc_{which}_fn"), getattr(self, f"hc_{which}_base"),
                     getattr(self, f"hc_{which}_scale"))
        mixes = hc_mixes(x, p.fn, c.norm_eps)
        pre, post, comb = hc_coefficients(mixes, p, c.hc_mult, c.hc_sinkhorn_iters, c.hc_eps)
        return hc_collapse(x, pre), post, comb

    def forward(self, x: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        y, post, comb = self._hc(x, "attn")
        x = hc_expand(self.attn(self.attn_norm(y), ctx), x, post, comb)
        y, post, comb = self._hc(x, "ffn")
        return hc_expand(self.ffn(self.ffn_norm(y), ctx.step.token_ids), x, post, comb)
