"""The compressor's one-launch pooling (ops/kernels/compressor.py) vs its plain-torch reference, one GPU.

    python benchmarks/kernels/compressor.py [--out DIR]

V4-Flash geometry: CSA (ratio 4, overlap, 2 x 512 channels, APE) and HCA (ratio 128, 512 channels); decode steps of
R rows (one token each, rows at positions that complete a group every `ratio` steps) and a 4K-token prefill chunk.
Timed in-step (`common.bench_graph_many`: one CUDA graph of back-to-back calls over state copies larger than L2).
Bytes: the fresh projections and APE read, this step's positions written to the (position-indexed) state, the slots
the completed groups read, the pooled entries written.
The kernel is checked against the reference first.
"""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import common
import torch

from v4serve.ops import compressor as comp
from v4serve.ops.kernels import compressor as kernel

HD = 512
SLOTS = 256
BLOCK = 256


def _step(R: int, per_row: int, start: int) -> SimpleNamespace:
    def t(x):
        return torch.as_tensor(x, dtype=torch.int64, device="cuda")

    starts = [start + 3 * r for r in range(R)]
    lens = [per_row] * R
    positions = torch.cat([torch.arange(s, s + per_row) for s in starts])
    nb = (start + 3 * R + per_row) // BLOCK + 2
    return SimpleNamespace(row_start=t(starts), row_len=t(lens), row_offset=t([per_row * r for r in range(R)]),
                           row_slot=t(list(range(R))), positions=t(positions),
                           token_row=t(torch.arange(R).repeat_interleave(per_row)),
                           block_table=t(torch.arange(R * nb).view(R, nb)), cached_len=t([0] * R),
                           num_tokens=R * per_row, num_rows=R)


def case(name: str, ratio: int, overlap: bool, R: int, per_row: int, ceil: dict) -> dict:
    C = 2 if overlap else 1
    W = C * HD
    step = _step(R, per_row, 4096 + ratio - 1)  # row 0 completes a group at decode: the costlier step
    T = step.num_tokens
    g = torch.Generator(device="cuda").manual_seed(0)
    kv = torch.randn(T, W, device="cuda", generator=g)
    sc = torch.randn(T, W, device="cuda", generator=g)
    ape = torch.randn(ratio, W, device="cuda", generator=g) if overlap else None
    groups = comp.completed_groups(step, ratio)
    nbytes_state = 2 * (SLOTS + 1) * C * ratio * W * 4
    copies = common.copies_past_l2(nbytes_state, cap=8)
    states = [(torch.randn(SLOTS + 1, C * ratio, W, device="cuda", generator=g),
               torch.randn(SLOTS + 1, C * ratio, W, device="cuda", generator=g)) for _ in range(copies)]
    # check first
    a = [s.clone() for s in states[0]]
    b = [s.clone() for s in states[0]]
    want = comp.pool_groups_reference(kv, sc, ape, step, groups, a[0], a[1], ratio, overlap, HD, torch.bfloat16)
    got = kernel.pool_groups(kv, sc, ape, step, groups, b[0], b[1], ratio, overlap, HD, torch.bfloat16)
    v = groups.valid
    err = float((got[v].float() - want[v].float()).abs().max()) if bool(v.any()) else 0.0
    ok = err <= 1e-2 and torch.allclose(a[0][:SLOTS], b[0][:SLOTS], atol=1e-5)  # the trash slot: any write
    G = T // ratio + R
    nv = int(groups.valid.sum())
    # fresh kv + score read, APE read, this step's positions written to the state, the valid groups' slots read
    # (an upper bound: some come from the fresh rows), the pooled entries written
    moved = (2 * T * W * 4 + (ratio * W * 4 if ape is not None else 0) + 2 * T * W * 4 + nv * 2 * C * ratio * HD * 4
             + G * HD * 2)
    fns_k = [lambda s=s: kernel.pool_groups(kv, sc, ape, step, groups, s[0], s[1], ratio, overlap, HD,
                                            torch.bfloat16) for s in states]
    fns_r = [lambda s=s: comp.pool_groups_reference(kv, sc, ape, step, groups, s[0], s[1], ratio, overlap, HD,
                                                    torch.bfloat16) for s in states]
    k_ms = common.bench_graph_many(fns_k)
    r_ms = common.bench_graph_many(fns_r)
    gbs = moved / (k_ms * 1e-3) / 1e9
    row = {"case": name, "rows": R, "tokens": T, "kernel_us": k_ms * 1e3, "reference_us": r_ms * 1e3,
           "GB_s": gbs, "pct_hbm": 100 * gbs * 1e9 / ceil["hbm_bytes_per_s"], "matches_reference": ok}
    print(f"| {name} | {R} | {T} | {k_ms * 1e3:.1f} | {r_ms * 1e3:.1f} | {gbs:.0f} ({row['pct_hbm']:.1f}%) | {ok} |")
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    ceil = common.measure_ceilings()
    print(common.describe(ceil))
    print("| layer | rows | tokens | kernel us | torch us | GB/s (% HBM) | matches |\n|---|---|---|---|---|---|---|")
    rows = []
    for R in (1, 32, 64):
        rows.append(case("CSA decode", 4, True, R, 1, ceil))
        rows.append(case("HCA decode", 128, False, R, 1, ceil))
    rows.append(case("CSA prefill", 4, True, 1, 4096, ceil))
    rows.append(case("HCA prefill", 128, False, 1, 4096, ceil))
    common.write_json(args.out, "compressor", {"ceilings": ceil, "rows": rows})


if __name__ == "__main__":
    main()
