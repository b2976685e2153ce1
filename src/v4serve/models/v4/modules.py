"""Small parameter holders whose attribute paths match the released tensor names."""

from __future__ import annotations

import torch
from torch import nn

from ...ops import backend
from ...ops.finish import finish_rows
from ...ops.linear import Linear
from ...ops.norm import rms_norm_fp8
from ...ops.quant import Quantized


class Norm(nn.Module):
    """RMSNorm with a weight (`<prefix>.weight` in checkpoints); one launch on the fast path (ops.finish)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)
        self.eps = eps
        self.backend = backend.current()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return finish_rows(x, self.weight, self.eps, None, None, False, None, 0, backend=self.backend)

    def feeding(self, x: torch.Tensor, gemm: Linear) -> tuple[torch.Tensor, torch.Tensor | Quantized]:
        """(the normed rows, the input `gemm` takes): for a GEMM that quantizes its activations, the rows already
        quantized, in the norm's launch on the kernels' path (ops.norm.rms_norm_fp8); the rows themselves otherwise."""
        if not gemm.act_group or not backend.fused("norm_quant"):
            y = self(x)
            return y, y
        return rms_norm_fp8(x, self.weight, self.eps, gemm.act_group, self.backend)


class CompressorParams(nn.Module):
    """wkv / wgate / ape / norm of one compressor (V4: main and indexer; V4.1: CSA2 sources)."""

    def __init__(self, dim: int, head_dim: int, ratio: int, overlap: bool, gated: bool, ape: bool, eps: float):
        super().__init__()
        coff = 2 if overlap else 1
        self.ratio, self.overlap, self.head_dim = ratio, overlap, head_dim
        self.wkv = Linear(dim, coff * head_dim)
        self.wgate = Linear(dim, coff * head_dim) if gated else None
        self.ape = nn.Parameter(torch.zeros(ratio, coff * head_dim), requires_grad=False) if ape else None
        self.norm = Norm(head_dim, eps)


def compressor_linears(*compressors: CompressorParams) -> list[Linear]:
    """wkv (and wgate) of each compressor, in order: one RowStack projects x through all of them."""
    return [m for p in compressors for m in (p.wkv, p.wgate) if m is not None]


def split_projections(outs: list[torch.Tensor], *compressors: CompressorParams
                      ) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """A RowStack's outputs over compressor_linears(*compressors) -> (kv, score) of each compressor."""
    it = iter(outs)
    return [(next(it), next(it) if p.wgate is not None else None) for p in compressors]


def param(*shape: int, dtype: torch.dtype = torch.float32) -> nn.Parameter:
    return nn.Parameter(torch.zeros(*shape, dtype=dtype), requires_grad=False)
