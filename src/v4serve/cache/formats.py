"""Record formats of cached KV rows, compressed entries and index keys.

A codec turns rows of values [N, D] into stored rows [N, R] and back. The quantized records are the byte
layouts the released kernels use (per entry; FlashMLA groups a block's scales after its token data, which
changes where bytes sit but not how many):

* `v4_fp8`  (V4 window KV and compressed entries, 584 B at D=512): nope dims FP8 e4m3 with one ue8m0 scale per 64,
  rope dims BF16, the scale bytes, one pad byte.
* `fp8_b32` (V4.1 window KV, 528 B): all dims FP8 e4m3 with one ue8m0 scale per 32.
* `nvfp4`   (V4.1 compressed entries, 288 B): FP4 e2m1 packed two per byte, one E4M3 scale per 16.
* `mxfp4`   (index keys, 68 B at D=128): FP4 e2m1 packed, one ue8m0 scale per 32.
* `fp8_row` (index keys, 132 B at D=128): FP8 e4m3 with one float32 scale per row (vLLM's default layout).
* `plain`   (auto / bf16): values stored in a float dtype.

DeepSeek's reference applies exactly these quantizations as simulations (V4: FP8 nope, FP4 index keys; V4.1:
FP8-per-32 window, NVFP4 entries, MXFP4 keys), so storing a simulated row is lossless.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..ops import quant


@dataclass(frozen=True)
class Codec:
    kind: str
    dim: int
    rope_dim: int = 0
    dtype: torch.dtype = torch.float32  # plain storage dtype / decode dtype

    @property
    def record_bytes(self) -> int:
        d, r = self.dim, self.rope_dim
        if self.kind == "plain":
            return d * torch.empty(0, dtype=self.dtype).element_size()
        if self.kind == "v4_fp8":
            nope = d - r
            return nope + 2 * r + nope // 64 + 1
        if self.kind == "fp8_b32":
            return d + d // 32
        if self.kind == "nvfp4":
            return d // 2 + d // 16
        if self.kind == "mxfp4":
            return d // 2 + d // 32
        if self.kind == "fp8_row":
            return d + 4
        raise ValueError(f"unknown record format {self.kind!r}")

    @property
    def storage_dtype(self) -> torch.dtype:
        return self.dtype if self.kind == "plain" else torch.uint8

    @property
    def row_width(self) -> int:
        """Elements per stored row (values for plain storage, bytes otherwise)."""
        return self.dim if self.kind == "plain" else self.record_bytes

    # --------------------------------------------------------------------------------------------
    def encode(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "plain":
            return x.to(self.dtype)
        d, r = self.dim, self.rope_dim
        n = x.shape[0]
        if self.kind == "v4_fp8":
            q, s = quant.fp8_quantize(x[:, : d - r], 64)
            rope = x[:, d - r:].to(torch.bfloat16).contiguous().view(torch.uint8)
            pad = torch.zeros(n, 1, dtype=torch.uint8, device=x.device)
            return torch.cat([q.view(torch.uint8), rope, quant.e8m0_from_pow2(s), pad], dim=1)
        if self.kind == "fp8_b32":
            q, s = quant.fp8_quantize(x, 32)
            return torch.cat([q.view(torch.uint8), quant.e8m0_from_pow2(s)], dim=1)
        if self.kind in ("nvfp4", "mxfp4"):
            group, fmt = (16, "e4m3") if self.kind == "nvfp4" else (32, "ue8m0")
            v, s = quant.fp4_quantize(x, group, fmt)
            packed = quant.fp4_pack(quant.fp4_codes(v))
            sb = s.to(torch.float8_e4m3fn).view(torch.uint8) if fmt == "e4m3" else quant.e8m0_from_pow2(s)
            return torch.cat([packed, sb], dim=1)
        if self.kind == "fp8_row":
            amax = x.float().abs().amax(-1, keepdim=True).clamp_min(1e-8)
            s = amax / quant.FP8_MAX
            q = (x.float() / s).clamp(-quant.FP8_MAX, quant.FP8_MAX).to(torch.float8_e4m3fn)
            return torch.cat([q.view(torch.uint8), s.contiguous().view(torch.uint8)], dim=1)
        raise ValueError(self.kind)

    def decode(self, rec: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
        if self.kind == "plain":
            return rec.to(out_dtype)
        d, r = self.dim, self.rope_dim
        if self.kind == "v4_fp8":
            nope = d - r
            q = rec[:, :nope].contiguous().view(torch.float8_e4m3fn)
            rope = rec[:, nope:nope + 2 * r].contiguous().view(torch.bfloat16)
            s = quant.e8m0_to_float(rec[:, nope + 2 * r: nope + 2 * r + nope // 64])
            return torch.cat([quant.fp8_dequantize(q, s, 64), rope.float()], dim=1).to(out_dtype)
        if self.kind == "fp8_b32":
            q = rec[:, :d].contiguous().view(torch.float8_e4m3fn)
            s = quant.e8m0_to_float(rec[:, d:])
            return quant.fp8_dequantize(q, s, 32).to(out_dtype)
        if self.kind in ("nvfp4", "mxfp4"):
            group = 16 if self.kind == "nvfp4" else 32
            v = quant.fp4_from_codes(quant.fp4_unpack(rec[:, : d // 2]))
            sb = rec[:, d // 2:]
            s = sb.contiguous().view(torch.float8_e4m3fn).float() if self.kind == "nvfp4" else quant.e8m0_to_float(sb)
            return (v.unflatten(-1, (-1, group)) * s.unsqueeze(-1)).flatten(-2).to(out_dtype)
        if self.kind == "fp8_row":
            q = rec[:, :d].contiguous().view(torch.float8_e4m3fn).float()
            s = rec[:, d:].contiguous().view(torch.float32)
            return (q * s).to(out_dtype)
        raise ValueError(self.kind)


def window_codec(family: str, kv_dtype: str, dim: int, rope: int, compute: torch.dtype) -> Codec:
    if kv_dtype in ("auto",):
        return Codec("plain", dim, rope, compute)
    if kv_dtype == "bf16":
        return Codec("plain", dim, rope, torch.bfloat16)
    if kv_dtype in ("fp8", "fp4"):
        return Codec("v4_fp8" if family == "v4" else "fp8_b32", dim, rope)
    raise ValueError(f"--kv-cache-dtype must be auto, bf16, fp8 or fp4, got {kv_dtype!r}")


def compressed_codec(family: str, kv_dtype: str, dim: int, rope: int, compute: torch.dtype) -> Codec:
    if family == "v41" and kv_dtype in ("fp4", "fp8"):
        # V4.1's global KV is NVFP4 (288 B); an FP8 record of it would be larger and no more exact
        return Codec("nvfp4" if kv_dtype == "fp4" else "fp8_b32", dim, rope)
    if family == "v4" and kv_dtype == "fp4":
        raise ValueError("--kv-cache-dtype fp4 is V4.1's compressed format; use fp8 for V4 models")
    return window_codec(family, kv_dtype, dim, rope, compute)


def index_codec(index_dtype: str, dim: int, compute: torch.dtype) -> Codec:
    if index_dtype == "auto":
        return Codec("plain", dim, 0, compute)
    if index_dtype == "bf16":
        return Codec("plain", dim, 0, torch.bfloat16)
    if index_dtype == "fp8":
        return Codec("fp8_row", dim)
    if index_dtype == "fp4":
        return Codec("mxfp4", dim)
    raise ValueError(f"--index-cache-dtype must be auto, bf16, fp8 or fp4, got {index_dtype!r}")
