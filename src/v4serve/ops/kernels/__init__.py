"""Triton kernels of the op families (each beside its plain-torch reference in ops/<family>.py)."""

import os


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (tests). Its bf16 `tl.dot` multiplies the raw uint16 bit
    patterns (triton 3.6), so kernels pass this as a constexpr and take bf16 dots through fp32 there."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
