"""The compressor's one-launch pooling (ops/kernels/compressor.py) against ops.compressor.pool_groups_reference.

Each case is a step of several rows at arbitrary positions (partial groups carried in from the state, rows that
complete no group, several groups, an empty row), random state and projections, APE or none, a paged block table
with holes and a cached prefix: the kernel must give the reference's pooled entries and next state
(float64 under the interpreter to 1e-12; on the GPU, V4's real widths in float32).
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from v4serve.ops import compressor as comp
from v4serve.ops.indexer import Entries
from v4serve.ops.kernels import compressor as kernel

ON_GPU = torch.cuda.is_available() and os.environ.get("V4SERVE_TEST_DEVICE", "").startswith("cuda")
DEVICE = "cuda" if ON_GPU else "cpu"
DTYPE = torch.float32 if ON_GPU else torch.float64
TOL = 1e-5 if ON_GPU else 1e-12
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")

BLOCK = 16  # positions per block


def _step(starts: list[int], lens: list[int], slots: list[int], g: torch.Generator,
          one_token_rows: bool = False) -> SimpleNamespace:
    R = len(starts)
    n_blocks = max(-(-(s + n) // BLOCK) for s, n in zip(starts, lens)) + 1
    table = torch.randperm(R * n_blocks + 3, generator=g)[: R * n_blocks].view(R, n_blocks)
    table[0, -1] = -1  # an unmapped block
    offs = torch.cumsum(torch.tensor([0] + lens[:-1]), 0)
    positions = torch.cat([torch.arange(s, s + n) for s, n in zip(starts, lens)])

    def t(x):
        return torch.as_tensor(x, dtype=torch.int64).to(DEVICE)

    return SimpleNamespace(
        row_start=t(starts), row_len=t(lens), row_offset=t(offs), row_slot=t(slots), positions=t(positions),
        token_row=t(torch.repeat_interleave(torch.arange(R), torch.tensor(lens))),
        block_table=t(table), cached_len=t([min(s, 2 * BLOCK) if i % 2 else 0 for i, s in enumerate(starts)]),
        num_tokens=int(sum(lens)), num_rows=R, n_blocks=R * n_blocks + 3, one_token_rows=one_token_rows)


CASES = {  # (ratio, overlap, starts, lens); "+writes": one token per row, the state writes in the pooling launch
    "csa-prefill": (4, True, [0, 5, 13, 30], [11, 7, 1, 0]),
    "csa-decode": (4, True, [3, 7, 8, 21], [1, 1, 1, 1]),
    "csa-decode+writes": (4, True, [3, 7, 8, 21], [1, 1, 1, 1]),
    "hca": (16, False, [0, 17, 40], [20, 15, 1]),
    "hca-decode+writes": (16, False, [15, 17, 40], [1, 1, 1]),
    "csa2": (2, False, [0, 3, 9], [5, 2, 1]),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("ape", [True, False])
def test_pool_groups_kernel_matches_reference(case: str, ape: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    ratio, overlap, starts, lens = CASES[case]
    if case.endswith("+writes"):  # one launch: the separate state-write kernel must not run
        monkeypatch.setattr(kernel, "_write_state_kernel", None)
    if ape and not overlap:
        pytest.skip("APE comes with V4's overlapping compressors only")
    g = torch.Generator().manual_seed(sorted(CASES).index(case))
    hd = 512 if ON_GPU else 32
    C = 2 if overlap else 1
    slots = [2, 0, 3, 1][: len(starts)]
    step = _step(starts, lens, slots, g, one_token_rows=case.endswith("+writes"))
    T, W = step.num_tokens, C * hd

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(DEVICE, DTYPE)

    kv, score = rnd(T, W), rnd(T, W)
    ape_t = rnd(ratio, W) if ape else None
    state_kv, state_sc = rnd(5, C * ratio, W), rnd(5, C * ratio, W)
    state_sc[4, 1] = float("-inf")  # empty slots as the state pool keeps them
    groups = comp.completed_groups(step, ratio)
    ref_kv, ref_sc = state_kv.clone(), state_sc.clone()
    want = comp.pool_groups_reference(kv, score, ape_t, step, groups, ref_kv, ref_sc, ratio, overlap, hd, DTYPE)
    got = kernel.pool_groups(kv, score, ape_t, step, groups, state_kv, state_sc, ratio, overlap, hd, DTYPE)
    v = groups.valid  # padded groups' values are unspecified: their rows are the trash block's
    assert int(v.sum()) > 0 and bool((~v).any())
    where = Entries(step.block_table, step.token_row, step.positions, ratio, BLOCK, step.n_blocks, 8)
    rows, epb = comp.dest_rows(step, groups, where), BLOCK // ratio
    assert (rows[~v] >= step.n_blocks * epb).all()
    for g in torch.nonzero(v).flatten().tolist():  # a fresh entry goes to its block's row, a cached one nowhere
        r, j = int(groups.row[g]), int(groups.entry[g])
        block = int(step.block_table[r, j * ratio // BLOCK])
        fresh = (j + 1) * ratio > int(step.cached_len[r]) and block >= 0
        assert int(rows[g]) == (block * epb + j % epb if fresh else step.n_blocks * epb + j % epb)
    assert torch.allclose(got[v], want[v], rtol=TOL, atol=TOL)
    # the state of every real slot (the trash slot, 4, takes many writes at once: any of them may stay there)
    got_kv, got_sc, ref_kv, ref_sc = state_kv[:4], state_sc[:4], ref_kv[:4], ref_sc[:4]
    assert torch.allclose(got_kv, ref_kv, rtol=TOL, atol=TOL)
    assert torch.equal(torch.isinf(got_sc), torch.isinf(ref_sc))
    fin = torch.isfinite(ref_sc)
    assert torch.allclose(got_sc[fin], ref_sc[fin], rtol=TOL, atol=TOL)
