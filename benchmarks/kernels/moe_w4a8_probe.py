"""Static probe (no GPU): what a W4A8 decode body for the FP4 experts would cost in instructions, compiled for sm_90.

    python benchmarks/kernels/moe_w4a8_probe.py      # without TRITON_INTERPRET

The routed experts' decode GEMMs dequantize FP4 to bf16 (2.5 instructions a weight value in PTX) and spend 3.7 SASS
instructions a value in the gate-up's K loop (RESULTS.md, sixth session). This probe builds one matrix of a
W4A8 alternative and prints its K loop's SASS per weight value: FP4 -> e4m3 by bit operations (a code c reads as
e2m1(c) * 2^-6 in e4m3: 0.5 instructions a value), the weight tile as wgmma's register A operand with each 32-group's
K order permuted to [low nibbles | high nibbles] (so no shuffles: x must be stored in that order), x as e4m3 codes
loaded by async copy, the per-32 weight scale applied to each group's partial product, x's per-128 scale per K tile.
First reading (2026-12-01): 3.27 instructions a value at 128 weight rows (FFMA 0.6 for the scales on a 16-column
accumulator of which one column is a token at T=1, address arithmetic per group ~0.9, the dequant 0.5): 12% fewer
than the bf16 body, not the 2x the dequant alone suggests. It is a tool for the next try, not a kernel in use.
"""

from __future__ import annotations

import collections
import re
import subprocess
import tempfile

import triton
import triton.language as tl
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@triton.jit
def _fp4_to_e4m3(p):
    """Packed FP4 bytes (4 a 32-bit word) -> (low, high) nibbles as e4m3 bytes = e2m1 value * 2^-6."""
    return tl.inline_asm_elementwise(
        asm="""
        {
        .reg .b32 a, b;
        shl.b32 a, $2, 2; and.b32 a, a, 0x1C1C1C1C; shl.b32 b, $2, 4; and.b32 b, b, 0x80808080; or.b32 $0, a, b;
        shr.b32 a, $2, 2; and.b32 a, a, 0x1C1C1C1C; and.b32 b, $2, 0x80808080; or.b32 $1, a, b;
        }
        """,
        constraints="=r,=r,r", args=[p], dtype=(tl.uint8, tl.uint8), is_pure=True, pack=4)


@triton.jit
def _probe(x_ptr, xs_ptr, w_ptr, s_ptr, y_ptr, K, stride_wn, stride_sn, stride_x,
           BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    offs_m = tl.arange(0, BM)
    offs_n = tl.arange(0, BN)
    acc = tl.zeros((BN, BM), tl.float32)
    for k0 in tl.range(0, K, BK, num_stages=3):
        tile = tl.zeros((BN, BM), tl.float32)
        for g in tl.static_range(BK // 32):
            kg = k0 + g * 32
            p = tl.load(w_ptr + offs_n[:, None] * stride_wn + kg // 2 + tl.arange(0, 16)[None, :])
            lo, hi = _fp4_to_e4m3(p)
            w = tl.reshape(tl.permute(tl.join(lo, hi), (0, 2, 1)), (BN, 32)).to(tl.float8e4nv, bitcast=True)
            xt = tl.load(x_ptr + (kg + tl.arange(0, 32))[:, None] + offs_m[None, :] * stride_x)
            part = tl.dot(w, xt.to(tl.float8e4nv, bitcast=True))
            s = tl.load(s_ptr + offs_n * stride_sn + kg // 32).to(tl.int32)
            tile += part * ((s + 6) << 23).to(tl.float32, bitcast=True)[:, None]
        acc += tile * tl.load(xs_ptr + offs_m * (K // 128) + k0 // 128)[None, :]
    tl.store(y_ptr + offs_n[:, None] * BM + offs_m[None, :], acc)


def loop_sass(kernel) -> tuple[list[str], str]:
    """(the opcodes of the longest backward-branch loop in the kernel's SASS, its register count)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        sass = subprocess.run([knobs.nvidia.cuobjdump.path, "-sass", f.name], capture_output=True, text=True,
                              check=True).stdout
        use = subprocess.run([knobs.nvidia.cuobjdump.path, "--dump-resource-usage", f.name], capture_output=True,
                             text=True, check=True).stdout
    ops = []
    for line in sass.splitlines():
        m = re.search(r"/\*([0-9a-f]{4,5})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if m:
            ops.append((int(m.group(1), 16), m.group(3), line))
    loops = []
    for off, op, line in ops:
        target = re.search(r"0x([0-9a-f]+)", line.split("BRA")[1]) if op.startswith("BRA") else None
        if target and int(target.group(1), 16) < off:
            loops.append((off - int(target.group(1), 16), int(target.group(1), 16), off))
    _, lo, hi = max(loops)
    return [op.split(".")[0] for off, op, _ in ops if lo <= off <= hi], re.search(r"REG:(\d+)", use).group(1)


def main() -> None:
    types = {"x_ptr": "*u8", "xs_ptr": "*fp32", "w_ptr": "*u8", "s_ptr": "*u8", "y_ptr": "*fp32"}
    for bn in (128, 64):
        const = {"BM": 16, "BN": bn, "BK": 128}
        sig, attrs = {}, {}
        for i, n in enumerate(_probe.arg_names):
            sig[n] = "constexpr" if n in const else types.get(n, "i32")
            if sig[n].startswith("*") or n.startswith("stride") or n == "K":
                attrs[(i,)] = [["tt.divisibility", 16]]
        kernel = triton.compile(ASTSource(_probe, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                                options={"num_warps": 4, "num_stages": 3})
        body, regs = loop_sass(kernel)
        per_thread = bn * 128 / 128  # weight values a thread covers per K tile (4 warps)
        print(f"W4A8 probe, {bn} weight rows x K tile 128, 16 token columns: K loop {len(body)} SASS a thread = "
              f"{len(body) / per_thread:.2f} a weight value, {regs} registers;",
              collections.Counter(body).most_common(10))


if __name__ == "__main__":
    main()
