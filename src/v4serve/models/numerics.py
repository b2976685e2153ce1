"""Which numerics the model follows: DeepSeek's official reference (default) or transformers'.

They differ in a few places (spec §3.10): the reference simulates its QAT formats (FP8 window KV and compressed
entries, Hadamard + FP4 index keys and queries, FP8 activations into quantized GEMMs) and leaves V4's shared
expert unclamped; transformers does none of the simulations and clamps the shared expert. V4.1's reference
clamps the shared expert and simulates its own formats (FP8 per 32 window KV, NVFP4 entries, MXFP4 index).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import ModelConfig

MODES = ("deepseek", "transformers")


@dataclass(frozen=True)
class Numerics:
    mode: str
    window_kv: str | None  # quant-dequant applied to new window KV rows: "v4_fp8" (nope per 64), "fp8_b32"
    compressed_kv: str | None  # ... to compressed entries: "v4_fp8", "nvfp4"
    index_rotate: bool  # Hadamard on index keys and queries (V4 reference)
    index_fp4: bool  # MXFP4 simulation of index keys and queries
    shared_clamp: bool  # SwiGLU clamp on the shared expert
    act_quant: bool  # FP8 activation simulation into quantized GEMMs
    weight_before_w2: bool  # routing weight multiplies the SwiGLU output before w2 (reference) or w2's output
    gate_eps: float  # added to the routing-weight normaliser


def numerics_for(config: ModelConfig, mode: str = "deepseek") -> Numerics:
    if mode not in MODES:
        raise ValueError(f"numerics must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "transformers":
        return Numerics(mode, None, None, False, False, True, False, False, 1e-20)
    if config.is_v41:
        return Numerics(mode, "fp8_b32", "nvfp4", False, True, True, True, True, 1e-20)
    return Numerics(mode, "v4_fp8", "v4_fp8", True, True, False, True, True, 0.0)
