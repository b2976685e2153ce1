"""Linear layers over the released weight formats: one entry point, a plain-torch reference and Triton kernels.

A `Linear` keeps the checkpoint's stored tensors as they are (FP8 e4m3 + e8m0 block scales, FP4 e2m1 packed two per
byte + per-32 e8m0 scales, or plain bf16/f32): no full-precision copy exists, ever. The reference dequantizes per
call; the kernels (ops/kernels/fp8_gemm.py) dequantize per tile in registers, or run FP8 x FP8 on the tensor cores.

DeepSeek's reference quantizes a quantized GEMM's *activations* to FP8 (1 x block, ue8m0 scales); `act_group`
reproduces that (the reference simulates it, the kernels do it for real: the same values).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import backend as kernels
from . import quant
from .profiling import family
from .shard import REPLICATED


def stored_format(weight: torch.Tensor) -> str:
    if weight.dtype == torch.float8_e4m3fn:
        return "fp8"
    if weight.dtype in (torch.int8, torch.uint8, torch.float4_e2m1fn_x2):
        return "fp4"
    return "float"


def scale_bytes(scale: torch.Tensor | None) -> torch.Tensor | None:
    """e8m0 scales as their exponent bytes (uint8), whatever dtype the checkpoint used; float scales unchanged."""
    if scale is None:
        return None
    if scale.dtype in (torch.float8_e8m0fnu, torch.uint8):
        return scale.view(torch.uint8)
    return scale


def dequantize(weight: torch.Tensor, scale: torch.Tensor | None, block: int,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A stored weight (or a stack of them, [..., out, in]) in full precision: the reference's per-call view."""
    fmt = stored_format(weight)
    if fmt == "fp8":
        if weight.dim() > 2:
            return torch.stack([dequantize(w, s, block, dtype) for w, s in zip(weight, scale)])
        return quant.fp8_block_dequantize_weight(weight, scale, block).to(dtype)
    if fmt == "fp4":
        return quant.fp4_dequantize_weight(weight, scale, 32).to(dtype)
    return weight.to(dtype)


def logical_shape(weight: torch.Tensor) -> tuple[int, ...]:
    shape = tuple(weight.shape)
    return shape[:-1] + (shape[-1] * 2,) if stored_format(weight) == "fp4" else shape


# ------------------------------------------------------------------------------------------------
# The entry points
# ------------------------------------------------------------------------------------------------

def linear_reference(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None, block: int,
                     act_group: int, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """y = x W^T in out_dtype (default x's dtype; x is cast to it first), W dequantized exactly, per call."""
    if out_dtype is not None:
        x = x.to(out_dtype)
    if act_group:
        x = quant.fp8_simulate(x, act_group)
    return F.linear(x, dequantize(weight, scale, block, x.dtype))


def linear(x: torch.Tensor | quant.Quantized, weight: torch.Tensor, scale: torch.Tensor | None, block: int,
           act_group: int = 0, backend: str = kernels.REFERENCE, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """y = x W^T for a weight in its stored format, computed as if x were cast to `out_dtype` first (default: x's
    dtype), the output in that dtype. A wider out_dtype than x's spares the kernels the widened copy of x: bf16 x
    against a bf16 weight (the compressors) gives exact products summed in float32 either way. x may come quantized
    by its producer (quant.Quantized, the activation quantization this weight applies): the same result, one launch
    fewer on the kernels' path."""
    given = isinstance(x, quant.Quantized)
    if given and x.group != act_group:
        raise ValueError(f"activations quantized per {x.group} for a linear that quantizes per {act_group}")
    with family("linear"):
        if backend == kernels.TRITON:
            from .kernels import fp8_gemm

            if given and out_dtype in (None, x.dtype) and fp8_gemm.supports_quantized(x, weight, block, act_group):
                return fp8_gemm.linear_quantized(x, weight, scale, block)
        if given:
            x = x.dequantize()  # the same values, and quantized again to the same ones (quant.Quantized)
        if out_dtype is not None and out_dtype.itemsize < x.dtype.itemsize:
            raise ValueError(f"out_dtype {out_dtype} is narrower than x's {x.dtype}: cast x instead")
        if backend == kernels.TRITON and fp8_gemm.supports(x, weight):
            return fp8_gemm.linear(x, weight, scale, block, act_group, out_dtype)
        return linear_reference(x, weight, scale, block, act_group, out_dtype)


def grouped_linear_reference(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None, block: int,
                             act_group: int) -> torch.Tensor:
    g = x.shape[1]
    if act_group:
        x = quant.fp8_simulate(x, act_group)
    w = dequantize(weight, scale, block, x.dtype)
    return torch.einsum("tgd,grd->tgr", x, w.view(g, -1, w.shape[-1]))


def grouped_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None, block: int,
                   act_group: int = 0, backend: str = kernels.REFERENCE, quant_out: int = 0
                   ) -> torch.Tensor | quant.Quantized:
    """x [T, G, K], W [G*N, K] (G independent projections stacked, e.g. V4's grouped `wo_a`) -> [T, G, N]. With
    `quant_out`, the output may come quantized per 1 x quant_out for the GEMM that consumes it (V4's `wo_b`) as a
    quant.Quantized, when the `gemv_quant_out` fusion is on (ops/backend.fused): where the decode kernel writes it from
    its accumulators (no launch of its own), and on the reference path whenever quant_out groups tile N; otherwise the
    plain output, which its consumer quantizes."""
    with family("linear"):
        if backend == kernels.TRITON:
            from .kernels import fp8_gemm

            if fp8_gemm.supports(x, weight):
                return fp8_gemm.grouped_linear(x, weight, scale, block, act_group, quant_out)
        y = grouped_linear_reference(x, weight, scale, block, act_group)
        if quant_out and y.shape[-1] % quant_out == 0 and kernels.fused("gemv_quant_out"):
            return quant.fp8_rows(y, quant_out)
        return y


# ------------------------------------------------------------------------------------------------
# The module
# ------------------------------------------------------------------------------------------------

class Linear(nn.Module):
    """y = x W^T with W [out, in] held in its stored format; `act_group` > 0 quantizes activations to FP8."""

    def __init__(self, in_features: int, out_features: int, shard: str = REPLICATED):
        """`shard`: how tensor parallelism splits this weight and its scales (ops/shard.py)."""
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.shard_rules = {} if shard == REPLICATED else {"weight": shard, "scale": shard}
        self.register_buffer("weight", None)
        self.register_buffer("scale", None)
        self.block = 0
        self.quantized = False
        self.act_group = 0
        self.backend = kernels.current()

    def set_weight(self, weight: torch.Tensor, scale: torch.Tensor | None, block: int) -> None:
        """Keep a checkpoint tensor as stored (the scale's e8m0 bytes as uint8)."""
        fmt = stored_format(weight)
        if logical_shape(weight) != (self.out_features, self.in_features):
            raise ValueError(f"weight of shape {list(logical_shape(weight))} does not fit "
                             f"[{self.out_features}, {self.in_features}]")
        if fmt != "float" and scale is None:
            raise ValueError(f"a {fmt} weight needs its scales")
        self.quantized = fmt != "float"
        self.block = block if fmt == "fp8" else 32
        self.weight = weight.view(torch.uint8) if fmt == "fp4" else weight
        self.scale = scale_bytes(scale) if self.quantized else None

    def forward(self, x: torch.Tensor | quant.Quantized, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        return linear(x, self.weight, self.scale, self.block, self.act_group, self.backend, out_dtype)

    def grouped(self, x: torch.Tensor, quant_out: int = 0) -> torch.Tensor | quant.Quantized:
        """x [T, G, in/G] through this weight viewed as G stacked [out/G, in/G] projections -> [T, G, out/G]
        (quantized per 1 x quant_out for its consumer when quant_out > 0: grouped_linear)."""
        return grouped_linear(x, self.weight, self.scale, self.block, self.act_group, self.backend, quant_out)

    def dequantized(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A temporary full-precision view (tests and tools; never kept by the model)."""
        return dequantize(self.weight, self.scale, self.block, dtype)

    def extra_repr(self) -> str:
        fmt = stored_format(self.weight) if self.weight is not None else "unset"
        return f"in={self.in_features}, out={self.out_features}, format={fmt}, act_group={self.act_group}"


class RowStack:
    """Linears that read the same input, run as one GEMM: `stack()` (after loading) moves their weights (and block
    scales) into row blocks of one tensor (each Linear keeps a view of its block, so nothing is held twice) and a call
    returns each projection as a column view of the one output. Quantized weights stack when they share a format,
    block and activation quantization, and each FP8 weight's rows fill whole scale blocks. Until then, or when the
    weights cannot share a tensor (other formats, dtypes or devices), each runs on its own."""

    def __init__(self, linears: list[Linear]):
        self.linears = linears
        self.weight: torch.Tensor | None = None  # the stacked weight, once stack() succeeded
        self.scale: torch.Tensor | None = None  # and its scales (quantized weights)

    def _compatible(self) -> bool:
        first = self.linears[0]
        for m in self.linears:
            w, s = m.weight, m.scale
            if (w is None or w.dtype != first.weight.dtype or w.device != first.weight.device
                    or m.in_features != first.in_features or m.backend != first.backend
                    or m.quantized != first.quantized or m.act_group != first.act_group or m.block != first.block):
                return False
            if m.quantized:
                fp8 = stored_format(w) == "fp8"
                if (s is None or s.dtype != first.scale.dtype or s.shape[1:] != first.scale.shape[1:]
                        or (fp8 and m.out_features % m.block) or s.shape[0] * (m.block if fp8 else 1) != w.shape[0]):
                    return False
        return True

    def stack(self) -> bool:
        if len(self.linears) < 2 or not self._compatible():
            return False
        first = self.linears[0]
        fp8 = first.quantized and stored_format(first.weight) == "fp8"
        self.weight = torch.cat([m.weight for m in self.linears])
        self.scale = torch.cat([m.scale for m in self.linears]) if first.quantized else None
        row = 0
        for m in self.linears:
            m.weight = self.weight[row:row + m.out_features]
            if self.scale is not None:  # FP8: a scale row per block of rows; FP4: one per row
                per = m.block if fp8 else 1
                m.scale = self.scale[row // per:(row + m.out_features) // per]
            row += m.out_features
        return True

    def __call__(self, x: torch.Tensor, out_dtype: torch.dtype | None = None) -> list[torch.Tensor]:
        if self.weight is None:
            return [m(x, out_dtype) for m in self.linears]
        first = self.linears[0]
        y = linear(x, self.weight, self.scale, first.block, first.act_group, first.backend, out_dtype)
        return list(y.split([m.out_features for m in self.linears], dim=-1))
