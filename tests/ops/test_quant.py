"""The quantization formats of the DeepSeek-V4 family against hand-computed values.

FP8 e4m3 with power-of-two (ue8m0) group/block scales 2^ceil(log2(amax/448)); FP4 e2m1 codes (bit 3 = sign,
magnitudes 0 .5 1 1.5 2 3 4 6), packed two per byte with the even element in the low nibble; e8m0 scale bytes
reinterpreted as exponents (value = 2^(b-127)); NVFP4 (E4M3 scale per 16) and MXFP4 (ue8m0 per 32).
"""

from __future__ import annotations

import math

import pytest
import torch

from v4serve.ops import quant


def test_fp4_code_table_and_sign_bit():
    codes = torch.arange(16, dtype=torch.uint8)
    vals = quant.fp4_from_codes(codes)
    mags = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    assert vals.tolist() == mags + [-m for m in mags]
    # encoding inverts decoding (the negative zero code 8 encodes as +0, code 0)
    nonzero = codes[(codes != 0) & (codes != 8)]
    assert torch.equal(quant.fp4_codes(quant.fp4_from_codes(nonzero)), nonzero)
    assert quant.fp4_codes(torch.tensor([0.0, -0.0])).tolist() == [0, 0]


def test_fp4_nibble_order_low_nibble_is_the_even_element():
    packed = quant.fp4_pack(torch.tensor([1, 2, 15, 0, 7, 8], dtype=torch.uint8))
    assert packed.tolist() == [0x21, 0x0F, 0x87]
    assert quant.fp4_unpack(packed).tolist() == [1, 2, 15, 0, 7, 8]
    assert quant.fp4_unpack(packed.view(torch.int8)).tolist() == [1, 2, 15, 0, 7, 8]  # checkpoints store int8


def test_fp4_weight_quantization_by_hand():
    # one row, one group of 32: amax 6 -> scale 1 (e8m0 byte 127); codes are then the values themselves
    w = torch.zeros(1, 32)
    w[0, :4] = torch.tensor([0.5, 6.0, -1.0, 0.0])
    w[0, 4:6] = torch.tensor([-6.0, 1.5])
    packed, scale = quant.fp4_quantize_weight(w)
    assert packed.dtype == torch.int8 and packed.shape == (1, 16)
    b = packed.view(torch.uint8)[0]
    assert b[:3].tolist() == [0x71, 0x0A, 0x3F]  # (0.5 | 6<<4), (-1 | 0<<4), (-6 | 1.5<<4)
    assert scale.dtype == torch.float8_e8m0fnu and scale.view(torch.uint8).tolist() == [[127]]
    assert torch.equal(quant.fp4_dequantize_weight(packed, scale), w)
    # the same row times 2^-3: same codes, scale 2^-3 (byte 124)
    packed2, scale2 = quant.fp4_quantize_weight(w * 0.125)
    assert torch.equal(packed2, packed) and scale2.view(torch.uint8).tolist() == [[124]]


def test_fp4_rounding_ties_go_to_the_even_code():
    x = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, -0.75, 0.26, 0.24, -5.1, 2.9])
    want = [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, -1.0, 0.5, 0.0, -6.0, 3.0]
    assert quant.fp4_round(x).tolist() == want


def test_e8m0_is_a_bit_reinterpretation():
    b = torch.tensor([0, 1, 100, 126, 127, 128, 130, 254], dtype=torch.uint8)
    want = [2.0**-127, 2.0**-126, 2.0**-27, 0.5, 1.0, 2.0, 8.0, 2.0**127]
    assert quant.e8m0_to_float(b).tolist() == want
    assert quant.e8m0_to_float(b.view(torch.float8_e8m0fnu)).tolist() == want
    s = torch.tensor([2.0**-10, 1.0, 4.0, 2.0**100])
    assert quant.e8m0_from_pow2(s).tolist() == [117, 127, 129, 227]
    assert torch.equal(quant.e8m0_to_float(quant.e8m0_from_pow2(s)), s)
    every = torch.arange(255, dtype=torch.int32).to(torch.uint8)  # every byte but 255 (NaN in e8m0, never stored)
    assert torch.equal(quant.e8m0_to_float(every).double(), torch.pow(2.0, every.double() - 127))


@pytest.mark.parametrize("amax,scale", [(448.0, 1.0), (449.0, 2.0), (896.0, 2.0), (1344.0, 4.0), (14.0, 2.0**-5),
                                        (14.001, 2.0**-4), (1e-6, 2.0**-22), (0.0, 2.0**-22)])
def test_fp8_group_scale_is_the_next_power_of_two_of_amax_over_448(amax, scale):
    x = torch.zeros(2, 64)
    x[1, 5] = -amax  # the sign does not matter; the other group stays all-zero (amax floored at 1e-4)
    s = quant.fp8_group_scale(x, 64)
    assert s[1, 0].item() == scale
    assert s[0, 0].item() == 2.0 ** math.ceil(math.log2(1e-4 / 448))
    assert quant.fp8_group_scale(x, 64, pow2=False)[1, 0].item() == pytest.approx(max(amax, 1e-4) / 448)


def test_fp8_block_scales_of_a_weight_by_hand():
    w = torch.zeros(256, 160)
    w[3, 7] = 1344.0  # block (0, 0): amax 448*3 -> scale 4 (byte 129); 1344/4 = 336 is a tie -> 320 (even)
    w[0, 0] = -1280.0  # exactly 320 * 4
    w[10, 130] = 448.0  # block (0, 1) (a partial 128x32 block): scale 1 (byte 127)
    w[200, 5] = 14.001  # block (1, 0): 14.001/448 is just above 2^-5 -> 2^-4 (byte 123)
    q, s = quant.fp8_block_quantize_weight(w, 128)  # block (1, 1) stays zero: floor 1e-4 -> 2^-22 (byte 105)
    assert q.dtype == torch.float8_e4m3fn and q.shape == (256, 160)
    assert s.dtype == torch.float8_e8m0fnu and s.shape == (2, 2)
    assert s.view(torch.uint8).tolist() == [[129, 127], [123, 105]]
    d = quant.fp8_block_dequantize_weight(q, s, 128)
    assert d[3, 7].item() == 1280.0 and d[0, 0].item() == -1280.0 and d[10, 130].item() == 448.0
    assert q[3, 7].float().item() == 320.0


def test_fp8_block_scale_formula_on_random_blocks():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(300, 200, generator=g) * torch.logspace(-3, 3, 300).unsqueeze(1)
    q, s = quant.fp8_block_quantize_weight(w, 128)
    assert s.shape == (3, 2)
    for i in range(3):
        for j in range(2):
            amax = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128].abs().max().item()
            assert quant.e8m0_to_float(s[i, j].view(torch.uint8)).item() == 2.0 ** math.ceil(math.log2(amax / 448))
    d = quant.fp8_block_dequantize_weight(q, s, 128)
    scale = quant.e8m0_to_float(s).repeat_interleave(128, 0)[:300].repeat_interleave(128, 1)[:, :200]
    # e4m3: 3 mantissa bits (relative half-step 2^-4), subnormal step 2^-9 at the block scale
    assert ((d - w).abs() <= w.abs() * 2.0**-4 + scale * 2.0**-10).all()


def test_fp8_group_quantize_dequantize_round_trip():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 256, generator=g) * torch.logspace(-4, 2, 64).unsqueeze(1)
    q, s = quant.fp8_quantize(x, 64)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (64, 4)
    d = quant.fp8_dequantize(q, s, 64)
    bound = x.abs() * 2.0**-4 + s.repeat_interleave(64, 1) * 2.0**-10
    assert ((d - x).abs() <= bound).all()
    # quantization uses the range: each group's amax lands in the top binade of e4m3 (224, 448]
    qmax = q.float().abs().unflatten(-1, (4, 64)).amax(-1)
    assert ((qmax >= 224) & (qmax <= 448)).all()
    # simulating twice changes nothing (a simulated row is exactly representable)
    sim = quant.fp8_simulate(x, 64)
    assert torch.equal(sim, d) and torch.equal(quant.fp8_simulate(sim, 64), sim)


def test_mxfp4_scales_and_round_trip():
    x = torch.zeros(3, 32)
    x[0, 0] = 6.0  # scale 1
    x[1, 3] = -7.0  # 7/6 -> 2
    x[1, 4] = 1.0  # 1/2 = 0.5 exactly
    x[1, 5] = 1.4  # 0.7 -> 0.5 (nearest; 0.75 would tie up to 1)
    s = quant.fp4_group_scale(x, 32)
    assert s[:, 0].tolist() == [1.0, 2.0, 2.0**-126]  # zero group: amax floored at 6 * 2^-126
    sim = quant.fp4_simulate(x, 32)
    assert sim[0, 0].item() == 6.0 and sim[1, 3].item() == -8.0 and sim[1, 4].item() == 1.0
    assert sim[1, 5].item() == 1.0
    g = torch.Generator().manual_seed(2)
    y = torch.randn(16, 128, generator=g)
    ys = quant.fp4_simulate(y, 32)
    assert torch.equal(quant.fp4_simulate(ys, 32), ys)
    sc = quant.fp4_group_scale(y, 32).repeat_interleave(32, 1)
    assert ((ys - y).abs() <= sc).all()  # at most half the largest step (2) of the grid
    p, ws = quant.fp4_quantize_weight(y)
    assert p.shape == (16, 64) and ws.shape == (16, 4)
    assert torch.equal(quant.fp4_dequantize_weight(p, ws), ys)


def test_nvfp4_scales_are_amax_over_6_rounded_to_e4m3():
    x = torch.zeros(5, 16)
    x[0, 0] = 1.8  # 0.3 -> nearest e4m3 is 0.3125 (1.25 * 2^-2), not the power of two 0.5
    x[1, 0] = 1.68  # 0.28 -> 0.28125 (1.125 * 2^-2)
    x[2, 0] = -6.0  # 1.0
    x[3, 0] = 6.0 * 1000  # 1000 -> clamped to the e4m3 maximum 448
    s = quant.fp4_group_scale(x, 16, "e4m3")
    # a zero group: amax floored at 6 * 2^-9, i.e. the smallest e4m3 subnormal (never a zero scale)
    assert s[:, 0].tolist() == [0.3125, 0.28125, 1.0, 448.0, 2.0**-9]
    assert quant.fp4_group_scale(x, 16, "ue8m0")[0, 0].item() == 0.5
    sim = quant.fp4_simulate(x, 16, "e4m3")
    assert sim[0, 0].item() == pytest.approx(6 * 0.3125)  # 1.8 / 0.3125 = 5.76 -> 6
    assert sim[2, 0].item() == -6.0
    assert (sim[4] == 0).all()
    g = torch.Generator().manual_seed(3)
    y = torch.randn(8, 512, generator=g)
    ys = quant.fp4_simulate(y, 16, "e4m3")
    assert torch.equal(quant.fp4_simulate(ys, 16, "e4m3"), ys)
    with pytest.raises(ValueError):
        quant.fp4_group_scale(y, 16, "e5m2")


def test_group_size_must_divide_the_row():
    with pytest.raises(ValueError, match="multiple"):
        quant.fp8_quantize(torch.ones(2, 100), 64)
