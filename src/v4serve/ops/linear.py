"""Linear layers over the released weight formats.

Weights load in their stored format (FP8 e4m3 + e8m0 block scales, FP4 e2m1 + per-32 e8m0 scales, or plain
floats) and are dequantized exactly into the compute dtype once (`materialize`). A layer remembers whether its
weight was quantized: DeepSeek's reference quantizes a quantized GEMM's *activations* to FP8 (1 x block,
ue8m0 scales), and `act_group` reproduces that when the numerics ask for it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import quant


def dequantize(weight: torch.Tensor, scale: torch.Tensor | None, fmt: str, block: int) -> torch.Tensor:
    if fmt == "fp8":
        return quant.fp8_block_dequantize_weight(weight, scale, block)
    if fmt == "fp4":
        return quant.fp4_dequantize_weight(weight, scale, 32)
    return weight.float()


def stored_format(weight: torch.Tensor) -> str:
    if weight.dtype == torch.float8_e4m3fn:
        return "fp8"
    if weight.dtype in (torch.int8, torch.uint8, torch.float4_e2m1fn_x2):
        return "fp4"
    return "float"


class Linear(nn.Module):
    """y = x W^T with W [out, in]; `act_group` > 0 simulates FP8 activation quantization per 1 x act_group."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight: torch.Tensor | None = None
        self.quantized = False
        self.act_group = 0

    def set_weight(self, weight: torch.Tensor, scale: torch.Tensor | None, block: int, dtype: torch.dtype) -> None:
        fmt = stored_format(weight)
        self.quantized = fmt != "float"
        w = dequantize(weight, scale, fmt, block)
        if tuple(w.shape) != (self.out_features, self.in_features):
            raise ValueError(f"weight of shape {tuple(w.shape)} does not fit [{self.out_features}, {self.in_features}]")
        self.weight = nn.Parameter(w.to(dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.act_group:
            x = quant.fp8_simulate(x, self.act_group)
        return F.linear(x, self.weight)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, quantized={self.quantized}, act_group={self.act_group}"
