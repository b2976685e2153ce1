"""The host-side integer helpers of ops/kernels (plain Python stand-ins for Triton's constexpr functions, whose calls
from Python cost microseconds each): the same values as Triton's over every argument the launches use."""

import triton

from v4serve.ops.kernels import cdiv, next_pow2


def test_cdiv_equals_tritons() -> None:
    assert all(cdiv(a, b) == triton.cdiv(a, b) for a in range(0, 600) for b in range(1, 70))
    assert cdiv(1 << 40, 128) == triton.cdiv(1 << 40, 128)


def test_next_pow2_equals_tritons() -> None:
    assert all(next_pow2(n) == triton.next_power_of_2(n) for n in range(0, 70000))
    assert next_pow2((1 << 33) + 1) == triton.next_power_of_2((1 << 33) + 1) == 1 << 34
