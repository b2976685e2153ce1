"""The lightning-indexer kernels (ops/kernels/indexer.py) against ops.indexer.index_topk_reference.

On the CPU the kernels run under Triton's interpreter (tests/conftest.py) on small shapes. The selection is discrete,
so the two bodies must return identical indices: float32 cases use operands on a coarse grid (products and sums are
exact in float32, so any summation order gives the same scores and every tie is a real tie); float64 cases use
random operands (the two bodies' scores differ by float64 rounding only, far below any gap between the float32
scores that are ranked). With V4SERVE_TEST_DEVICE=cuda* the GPU cases run V4-sized shapes in bf16 / FP8 on grid
operands, where tensor-core sums are exact too, so the picks must still be identical.
"""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch
from sm90_compile import run_compile

from v4serve.cache.formats import Codec
from v4serve.cache.pool import RowPool
from v4serve.ops import backend, indexer
from v4serve.ops.kernels import indexer as ik
from v4serve.ops.precision import hi_lo

_GPU_RUN = torch.cuda.is_available() and os.environ.get("V4SERVE_TEST_DEVICE", "").startswith("cuda")
# the interpreter cases build CPU tensors; on a GPU run the device cases at the end of the file cover the kernels
CPU_ONLY = pytest.mark.skipif(_GPU_RUN, reason="interpreter shapes on CPU tensors (the GPU cases below run instead)")

# the interpreter's own `int(array)` on loop bounds
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")

RATIO, BLOCK_SIZE, N_BLOCKS = 4, 16, 24  # 4 entries per block
EPB = BLOCK_SIZE // RATIO


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _grid(shape, g, lo: int = -8, hi: int = 8, scale: float = 0.25) -> torch.Tensor:
    return torch.randint(lo, hi + 1, shape, generator=g).double() * scale


def _pool(kind: str, d: int, g: torch.Generator, exact: bool, storage=torch.float64, zero: bool = False,
          pow2: bool = True) -> RowPool:
    """An index-key pool of N_BLOCKS blocks (+ trash) filled with random records (`exact`: grid values, FP8-row
    records with power-of-two scales unless not `pow2`, so that decoded keys have few significant bits)."""
    codec = Codec(kind, d, 0, storage)
    pool = RowPool(codec, N_BLOCKS * EPB + EPB - 1, "cpu")
    n = pool.data.shape[0]
    vals = torch.zeros(n, d, dtype=torch.float64) if zero else (_grid((n, d), g) if exact else
                                                                 torch.randn(n, d, generator=g, dtype=torch.float64))
    if kind == "fp8_row" and exact and pow2:
        scale = torch.full((n, 1), 0.5, dtype=torch.float32)
        pool.data[:] = torch.cat([vals.to(torch.float8_e4m3fn).view(torch.uint8), scale.view(torch.uint8)], 1)
    else:
        pool.data[:] = codec.encode(vals)
    return pool


def _layout(rows: list[tuple[int, int]], g: torch.Generator):
    """Rows given as (first position, tokens): block tables over a shuffled pool (blocks reused across rows: a shared
    prefix), -1 holes past each row's context, token_row and visible = (pos + 1) // RATIO."""
    perm = torch.randperm(N_BLOCKS, generator=g)
    nb = max(-(-(p + n) // BLOCK_SIZE) for p, n in rows) + 1
    bt = torch.full((len(rows), nb), -1, dtype=torch.long)
    for r, (p, n) in enumerate(rows):
        used = -(-(p + n) // BLOCK_SIZE)
        bt[r, :used] = perm[(torch.arange(used) + 3 * r) % N_BLOCKS]
        if r and used > 1:
            bt[r, 0] = bt[0, 0]  # the same physical block in two rows
    token_row = torch.cat([torch.full((n,), r, dtype=torch.long) for r, (_, n) in enumerate(rows)])
    pos = torch.cat([torch.arange(p, p + n) for p, n in rows])
    return bt, token_row, (pos + 1) // RATIO


def _case(kind: str, rows, dtype, seed: int, d: int = 32, h: int = 3, e_max: int | None = None, exact: bool = False,
          storage=torch.float64, zero_keys: bool = False, pow2: bool = True):
    g = _gen(seed)
    pool = _pool(kind, d, g, exact, storage, zero_keys, pow2)
    bt, token_row, visible = _layout(rows, g)
    E = e_max or max(1, -(-max(p + n for p, n in rows) // RATIO))
    entries = indexer.Entries(bt, token_row, visible, RATIO, BLOCK_SIZE, N_BLOCKS, E)
    T = token_row.shape[0]
    if exact:
        q, w = _grid((T, h, d), g, scale=0.125), _grid((T, h), g, -4, 4, 0.5)
    else:
        q = torch.randn(T, h, d, generator=g, dtype=torch.float64)
        w = torch.randn(T, h, generator=g, dtype=torch.float64)
    wdt = torch.float64 if dtype == torch.float64 else torch.float32
    return q.to(dtype), w.to(wdt), pool, entries


def _reference_scores(q, w, pool, entries, q_scale=None) -> torch.Tensor:
    """The reference's float32 scores [T, E_max] (before masking)."""
    if q_scale is not None:
        q = q.float() * q_scale.unsqueeze(-1)
    rows = entries.rows()
    keys = pool.codec.decode(pool.data[rows.reshape(-1)], q.dtype).view(*rows.shape, -1)
    return indexer.index_scores(q, w, keys[entries.token_row]).float()


def _same(q, w, pool, entries, k, config=None, check_scores: bool = True, **kw):
    """Kernel picks == reference picks; on dense rows also the visible scores (bitwise but for float64 operands)."""
    want = indexer.index_topk_reference(q, w, pool, entries, k, kw.get("candidates"), kw.get("publish", 0),
                                        kw.get("block", 1), kw.get("q_scale"), kw.get("w_scale", 1.0))
    scores = None
    if check_scores and kw.get("candidates") is None:  # (a given score buffer runs the step in one chunk)
        scores = kw["scores_out"] = torch.full((q.shape[0], entries.max_entries), float("nan"))
    got = ik.index_topk(q, w, pool, entries, k, config=config, **kw)
    if scores is not None:
        vis = torch.arange(entries.max_entries)[None, :] < entries.visible[:, None]
        ref = _reference_scores(q, indexer.weighted_heads(w, kw.get("w_scale", 1.0)), pool, entries, kw.get("q_scale"))
        if q.dtype != torch.float64:
            assert torch.equal(scores[vis], ref[vis])
        else:
            assert torch.allclose(scores[vis], ref[vis], rtol=1e-6, atol=1e-6)
    assert got[0].dtype == torch.long and got[0].shape == want[0].shape
    assert torch.equal(got[0], want[0]), f"\n{got[0]}\n{want[0]}"
    if want[1] is not None:
        assert torch.equal(got[1], want[1]), f"\n{got[1]}\n{want[1]}"
    return got


PREFILL_ROWS = [(0, 37), (40, 9), (130, 1), (3, 0), (61, 5)]  # rows of different lengths (one with no token here)


@pytest.mark.parametrize("kind,dtype,exact,storage", [
    ("plain", torch.float32, True, torch.float32),
    ("plain", torch.float64, False, torch.float64),
    ("plain", torch.float32, True, torch.bfloat16),  # bf16-stored keys widened to the float32 queries
    ("mxfp4", torch.float32, True, None),
    ("mxfp4", torch.float64, False, None),
    ("fp8_row", torch.float32, True, None),
    ("fp8_row", torch.float64, False, None),
], ids=["plain-fp32", "plain-fp64", "bf16-keys", "mxfp4-fp32", "mxfp4-fp64", "fp8-fp32", "fp8-fp64"])

@CPU_ONLY
def test_every_key_format_matches_reference(kind, dtype, exact, storage):
    """Several tokens per row (prefill chunks), rows of different lengths, paged tables with holes and reused blocks;
    k below, at and above the visible counts (0 .. 33 entries visible)."""
    q, w, pool, entries = _case(kind, PREFILL_ROWS, dtype, seed=1, exact=exact, storage=storage or torch.float64)
    for k in (1, 6, 16):
        _same(q, w, pool, entries, k)


@CPU_ONLY
@pytest.mark.parametrize("kind", ["mxfp4", "fp8_row"])
def test_bf16_queries(kind):
    """bf16 queries (the GPU's compute dtype): keys are decoded to bf16 as the reference decodes them, rounded to
    nearest (FP8-row keys of grid values with the encoder's amax/448 scales need it: 24-bit products)."""
    q, w, pool, entries = _case(kind, PREFILL_ROWS, torch.bfloat16, seed=2, exact=True, pow2=False)
    _same(q, w, pool, entries, 8)


@CPU_ONLY
def test_decode_rows_visible_edges():
    """One token per row with visible = 0, 1, k-1, k, k+1 and many more; block tables with holes."""
    k = 8
    rows = [(2, 1)] + [(p * RATIO + RATIO - 1, 1) for p in (0, k - 2, k - 1, k, 40)]  # position 2 sees nothing yet
    q, w, pool, entries = _case("mxfp4", rows, torch.float64, seed=3)
    assert entries.visible.tolist() == [0, 1, k - 1, k, k + 1, 41]
    got = _same(q, w, pool, entries, k)[0]
    assert (got >= 0).sum(1).tolist() == [0, 1, k - 1, k, k, k] and got[1, 0] == 0


@CPU_ONLY
@pytest.mark.parametrize("zero", [True, False], ids=["all-zero-keys", "duplicate-keys"])
def test_ties_break_toward_the_lower_index(zero):
    """Zero keys: every score is 0 (ReLU), the picks are the lowest visible indices. Duplicated key records: equal
    scores at several indices, ordered by index."""
    q, w, pool, entries = _case("plain", PREFILL_ROWS, torch.float32, seed=4, exact=True, storage=torch.float32,
                                zero_keys=zero)
    if not zero:
        src = pool.data[torch.arange(0, pool.data.shape[0], 3)]
        pool.data[:] = src.repeat_interleave(3, 0)[:pool.data.shape[0]]  # runs of 3 identical keys
        w = w.abs()
    got = _same(q, w, pool, entries, 12)[0]
    if zero:
        vis = entries.visible
        want = torch.arange(12).expand(len(vis), -1)
        assert torch.equal(got, torch.where(want < vis[:, None], want, -1))


@CPU_ONLY
def test_k_larger_than_entries():
    q, w, pool, entries = _case("fp8_row", [(0, 20), (5, 3)], torch.float64, seed=5)
    E = entries.max_entries
    got = _same(q, w, pool, entries, 3 * E)[0]
    assert got.shape == (23, E)


@CPU_ONLY
def test_candidates_restrict_the_selection():
    """Candidate blocks (of 4 entries) in score order with -1 padding, trailing and in between; blocks that hold no
    visible entry yet; the select runs within them exactly as select_entries with candidate_mask."""
    q, w, pool, entries = _case("mxfp4", [(0, 45), (100, 6)], torch.float64, seed=6, e_max=40)
    g = _gen(60)
    T, kc = q.shape[0], 6
    nb = -(-entries.max_entries // 4)
    cands = torch.stack([torch.randperm(nb, generator=g)[:kc] for _ in range(T)])
    cands[::3, 4:] = -1
    cands[1::4, 1] = -1
    cands[2, :] = -1
    for k in (5, 16, 30):
        _same(q, w, pool, entries, k, candidates=cands, block=4)


@CPU_ONLY
def test_publish_candidate_blocks():
    """The candidate source: the dense selection plus the top blocks (block max, newest forced, -1 = none), also with
    more blocks asked for than exist and with fewer visible blocks than asked."""
    q, w, pool, entries = _case("mxfp4", PREFILL_ROWS, torch.float64, seed=7)
    for topk_blocks, block in ((3, 4), (20, 2), (4, 8)):
        _same(q, w, pool, entries, 6, publish=topk_blocks, block=block)
    # and the published blocks fed to a later source, as V4.1 does
    _, blocks = ik.index_topk(q, w, pool, entries, 6, publish=3, block=4)
    _same(q * 0.5 + 0.1, w, pool, entries, 7, candidates=blocks, block=4)


@CPU_ONLY
def test_fp8_queries_with_row_scales():
    """FP8 e4m3 queries with one power-of-two scale per (token, head) row against FP8-row keys (the FP8 tensor-core
    path on a GPU; fp32 here)."""
    q, w, pool, entries = _case("fp8_row", PREFILL_ROWS, torch.float32, seed=8, exact=True)
    g = _gen(80)
    q_scale = 2.0 ** torch.randint(-2, 3, q.shape[:2], generator=g).float()
    _same(q.to(torch.float8_e4m3fn), w, pool, entries, 10, q_scale=q_scale)


@CPU_ONLY
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_head_weights_scaled_as_loaded(dtype):
    """w_scale (the model's 1 / sqrt(d * h), not a power of two) applied by the logits kernel as it loads w, over
    half-precision head weights (the indexer's weights_proj output as it is): the picks and visible scores of the
    reference, which widens w and multiplies (ops.indexer.weighted_heads); w_scale = 1 leaves w untouched. Random
    values: the picks compare, the scores (summed over heads in another order) do not bit for bit."""
    q, w, pool, entries = _case("mxfp4", PREFILL_ROWS, dtype, seed=12)
    scale = 128 ** -0.5 * 64 ** -0.5
    w_half = w.to(torch.bfloat16) if dtype == torch.float32 else w
    _same(q, w_half, pool, entries, 8, check_scores=False, w_scale=scale)
    heads = indexer.weighted_heads(w_half, scale)
    scores = torch.full((q.shape[0], entries.max_entries), float("nan"))
    ik.index_topk(q, w_half, pool, entries, 8, scores_out=scores, w_scale=scale)
    vis = torch.arange(entries.max_entries)[None, :] < entries.visible[:, None]
    ref = _reference_scores(q, heads, pool, entries)[vis]
    assert torch.allclose(scores[vis], ref, rtol=1e-5, atol=1e-6)  # (random values: summed in another order)
    assert not torch.allclose(scores[vis], ref / scale, rtol=1e-2)  # the scale is applied
    assert heads.dtype == dtype and indexer.weighted_heads(w_half, 1.0) is w_half
    hi, lo = hi_lo(scale)  # the two float32 parts the kernel gets
    assert torch.equal(heads, w_half.to(dtype) * (hi + lo))
    if dtype == torch.float32:  # float32 math: the float32 rounding of the scale, as `w.float() * scale` in torch
        assert torch.equal(heads, w_half.float() * scale)
    else:  # float64: ~48 bits of it
        assert abs((hi + lo) - scale) <= scale * 2.0 ** -47
    assert torch.equal(indexer.index_topk_reference(q, w_half, pool, entries, 8, w_scale=scale)[0],
                       indexer.index_topk_reference(q, heads, pool, entries, 8)[0])


@CPU_ONLY
def test_head_weights_rounded_as_loaded():
    """w_dtype: float32 head weights (the float32 sums of the stacked GEMM that holds weights_proj) rounded to bf16 by
    the logits kernel as it loads them, no copy: the scores, bit for bit, and picks of a bf16 copy passed as is, and
    the reference's (which rounds first); without w_dtype the float32 values score differently."""
    q, w, pool, entries = _case("mxfp4", PREFILL_ROWS, torch.float32, seed=13)
    w = w * (1 + torch.rand(w.shape, generator=torch.Generator().manual_seed(5)) * 2 ** -9)  # off the bf16 grid
    scale = 128 ** -0.5 * 64 ** -0.5
    got, want = (torch.full((q.shape[0], entries.max_entries), float("nan")) for _ in range(2))
    picks = ik.index_topk(q, w, pool, entries, 8, scores_out=got, w_scale=scale, w_dtype=torch.bfloat16)[0]
    ik.index_topk(q, w.to(torch.bfloat16), pool, entries, 8, scores_out=want, w_scale=scale)
    vis = torch.arange(entries.max_entries)[None, :] < entries.visible[:, None]
    assert torch.equal(got[vis], want[vis])
    assert torch.equal(picks, indexer.index_topk(q, w, pool, entries, 8, w_scale=scale, w_dtype=torch.bfloat16)[0])
    assert torch.equal(picks, indexer.index_topk_reference(q, w.to(torch.bfloat16), pool, entries, 8,
                                                           w_scale=scale)[0])
    unrounded = torch.full_like(got, float("nan"))
    ik.index_topk(q, w, pool, entries, 8, scores_out=unrounded, w_scale=scale)
    assert not torch.equal(unrounded[vis], got[vis])


@pytest.mark.parametrize("cfg", [ik.Config(block_t=4, block_e=16, split=3, select_block=16),
                                 ik.Config(block_t=1, block_e=64, split=1, select_block=256),
                                 ik.Config(block_t=8, block_e=32, split=0, select_block=32)],
                         ids=["t4-e16-s3", "t1-e64", "t8-auto-split"])
@CPU_ONLY
def test_tilings_agree(cfg):
    """Token blocks straddling rows, entry tiles that do not divide E, several splits per token block, select steps
    smaller than a row."""
    q, w, pool, entries = _case("plain", PREFILL_ROWS, torch.float64, seed=9, h=4)
    _same(q, w, pool, entries, 9, config=cfg)
    _same(q, w, pool, entries, 9, config=cfg, publish=3, block=4)


@pytest.mark.parametrize("digit", [2, 3, 5, 6])
@CPU_ONLY
def test_select_digit_widths_agree(digit):
    """Radix digits narrower than 8 bits (more passes, each a cheaper histogram; 3 and 5 do not divide the key's
    bits): the reference's picks on grid scores full of ties (the entry-id digits decide them), on float64 scores,
    and over published candidate blocks."""
    cfg = ik.Config(block_t=2, block_e=32, split=2, select_block=64, select_digit=digit, select_hist=False)
    q, w, pool, entries = _case("plain", PREFILL_ROWS, torch.float32, seed=12, exact=True)
    _same(q, w, pool, entries, 9, config=cfg)
    q, w, pool, entries = _case("mxfp4", PREFILL_ROWS, torch.float64, seed=13)
    _same(q, w, pool, entries, 7, config=cfg, publish=3, block=4)
    with pytest.raises(ValueError, match="select_digit"):
        _same(q, w, pool, entries, 7, config=ik.Config(block_t=2, block_e=32, select_digit=9))


@pytest.mark.parametrize("narrow", [False, True])
@CPU_ONLY
def test_resident_keys_agree(narrow):
    """select_resident: rows of <= select_block positions keep their keys in registers through the radix passes
    (longer rows take the loop): the reference's picks on grid scores full of ties, on float64 scores, over published
    candidate blocks and within them, with both sort widths."""
    cfg = ik.Config(block_t=2, block_e=32, split=2, select_block=16, select_resident=True, select_narrow=narrow,
                    select_hist=False)
    q, w, pool, entries = _case("plain", PREFILL_ROWS, torch.float32, seed=15, exact=True)
    assert bool((entries.visible <= 16).any()) and bool((entries.visible > 16).any())  # both paths in the step
    _same(q, w, pool, entries, 9, config=cfg)
    q, w, pool, entries = _case("mxfp4", PREFILL_ROWS, torch.float64, seed=16)
    blocks = _same(q, w, pool, entries, 7, config=cfg, publish=3, block=4)[1]
    _same(q, w, pool, entries, 5, config=cfg, candidates=blocks, block=4)


@pytest.mark.parametrize("cap,digit", [(4096, 8), (4, 5), (1, 8)], ids=["cap4096", "cap4-digit5", "cap1"])
@CPU_ONLY
def test_score_bins_agree(cap, digit):
    """select_hist: the logits launch bins each token's scores, the select takes the k-th largest key's bin from the
    counts and radix-selects within it, or (more than select_cap keys in it) falls back to the plain radix: the
    reference's picks on grid scores full of ties and crowded bins (all-zero keys: one bin), on float64 scores, beside
    published blocks (their own select has no bins) and within them, with a select step smaller than the rows."""
    cfg = ik.Config(block_t=2, block_e=32, split=2, select_block=16, select_digit=digit, select_cap=cap)
    q, w, pool, entries = _case("plain", PREFILL_ROWS, torch.float32, seed=17, exact=True)
    _same(q, w, pool, entries, 9, config=cfg)
    q, w, pool, entries = _case("plain", PREFILL_ROWS, torch.float32, seed=18, exact=True, zero_keys=True)
    _same(q, w, pool, entries, 12, config=cfg)
    q, w, pool, entries = _case("mxfp4", PREFILL_ROWS, torch.float64, seed=19)
    blocks = _same(q, w, pool, entries, 7, config=cfg, publish=3, block=4)[1]
    _same(q, w, pool, entries, 40, config=cfg)
    _same(q, w, pool, entries, 5, config=cfg, candidates=blocks, block=4)  # V4.1's candidate level: bins of its slots


@CPU_ONLY
def test_score_bins_count_the_visible_scores_and_are_left_zeroed():
    """The logits launch's bins hold each token's visible scores by _score_bin (the reference's float32 scores' top
    12 order-preserving bits); the select leaves them zeroed for the next launch (a per-device buffer on a GPU)."""
    q, w, pool, entries = _case("mxfp4", PREFILL_ROWS, torch.float64, seed=20)
    T, E = q.shape[0], entries.max_entries
    cfg = ik.default_config(T, False, False)
    hist = torch.zeros(T * ik.HIST_BINS, dtype=torch.int32)
    scores = torch.empty(T, E, dtype=torch.float32)
    ik.logits(q, w, pool, entries, scores, config=cfg, hist=hist)
    bits = scores.view(torch.int32).masked_fill(scores == 0, 0).long()
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    bins = (ordered >> 20) + 2048
    vis = torch.arange(E)[None, :] < entries.visible[:, None]
    want = torch.zeros(T, ik.HIST_BINS, dtype=torch.int32)
    want.scatter_add_(1, bins.clamp(0, ik.HIST_BINS - 1), vis.int())
    assert torch.equal(hist.view(T, -1), want) and int(hist.sum()) == int(entries.visible.sum())
    out = torch.empty(T, 7, dtype=torch.long)
    ik.select(scores, entries.visible, out, E, config=cfg, hist=hist)
    assert not hist.any()
    assert torch.equal(out, indexer.index_topk_reference(q, w, pool, entries, 7)[0])
    with pytest.raises(ValueError, match="score bins"):
        ik.select(scores, entries.visible, out, E, config=cfg, hist=hist, per=4)


@pytest.mark.parametrize("hist", [True, False], ids=["bins", "plain-radix"])
@CPU_ONLY
def test_unsorted_picks_are_the_same_set_in_the_order_found(hist):
    """select_sorted off: each row holds the reference's picks (ties to the lower id included), -1 in the same slots,
    in the order the select found them (the keys above the k-th key's bin by position, then that bin's by position;
    the plain radix by position) — not the reference's descending order — and the same on a second launch."""
    base = ik.Config(block_t=2, block_e=32, split=2, select_block=16, select_cap=8, select_hist=hist)
    cfg = dataclasses.replace(base, select_sorted=False)
    for seed, kind, dtype, k in ((21, "plain", torch.float32, 9), (22, "mxfp4", torch.float64, 12)):
        q, w, pool, entries = _case(kind, PREFILL_ROWS, dtype, seed=seed, exact=kind == "plain")
        want = indexer.index_topk_reference(q, w, pool, entries, k)[0]
        got = ik.index_topk(q, w, pool, entries, k, config=cfg)[0]
        assert torch.equal(got.sort(-1).values, want.sort(-1).values)
        assert torch.equal(got >= 0, want >= 0)
        assert torch.equal(ik.index_topk(q, w, pool, entries, k, config=cfg)[0], got)
        assert not torch.equal(got, want)  # the order is the one found, not the reference's
        assert torch.equal(ik.index_topk(q, w, pool, entries, k, config=base)[0], want)


class _Grids:
    """A Triton kernel whose launch grids are recorded (kernel[grid](...) as before)."""

    def __init__(self, kernel) -> None:
        self.kernel, self.grids = kernel, []

    def __getitem__(self, grid):
        self.grids.append(grid)
        return self.kernel[grid]


@pytest.mark.parametrize("programs", [2, 4])
@pytest.mark.parametrize("sort", [True, False], ids=["sorted", "unsorted"])
@CPU_ONLY
def test_split_select_matches_one_program(programs, sort, monkeypatch):
    """select_split: each of `programs` programs takes a contiguous chunk of a token's row, the last to arrive joins
    the chunks: the one-program select's rows bit for bit (the picks and their order, sorted or as found) on grid
    scores full of ties, on all-zero keys (one bin of more than select_cap keys: the last program's plain radix), on
    float64 scores and on V4.1's candidate slots; and the split kernel is what ran, over `programs` programs."""
    base = ik.Config(block_t=2, block_e=32, split=2, select_block=8, select_cap=8, select_sorted=sort)
    cfg = dataclasses.replace(base, select_split=programs)
    spy = _Grids(ik._select_split_kernel)
    monkeypatch.setattr(ik, "_select_split_kernel", spy)
    cases = [("plain", torch.float32, 17, 9, False), ("plain", torch.float32, 18, 12, True),
             ("mxfp4", torch.float64, 19, 12, False)]
    for kind, dtype, seed, k, zero in cases:
        q, w, pool, entries = _case(kind, PREFILL_ROWS, dtype, seed=seed, exact=kind == "plain", zero_keys=zero)
        assert int(entries.visible.max()) > 3 * base.select_block  # rows span several programs' chunks
        one = ik.index_topk(q, w, pool, entries, k, config=base)
        got = ik.index_topk(q, w, pool, entries, k, config=cfg, publish=3, block=4)
        assert torch.equal(got[0], one[0])
        assert torch.equal(ik.index_topk(q, w, pool, entries, k, config=cfg, candidates=got[1], block=4)[0],
                           ik.index_topk(q, w, pool, entries, k, config=base, candidates=got[1], block=4)[0])
        if sort:
            assert torch.equal(got[0], indexer.index_topk_reference(q, w, pool, entries, k)[0])
    assert spy.grids and all(g[1] == programs for g in spy.grids)


@CPU_ONLY
def test_split_select_leaves_the_bins_zeroed():
    """The split select's last program zeroes the token's score bins (after every program has read them), and a
    select_split that is no power of two is refused."""
    q, w, pool, entries = _case("mxfp4", PREFILL_ROWS, torch.float64, seed=20)
    T, E = q.shape[0], entries.max_entries
    cfg = dataclasses.replace(ik.default_config(T, False, False), select_split=4, select_block=8)
    hist = torch.zeros(T * ik.HIST_BINS, dtype=torch.int32)
    scores = torch.empty(T, E, dtype=torch.float32)
    ik.logits(q, w, pool, entries, scores, config=cfg, hist=hist)
    assert hist.any()
    out = torch.empty(T, 7, dtype=torch.long)
    ik.select(scores, entries.visible, out, E, config=cfg, hist=hist)
    assert not hist.any()
    assert torch.equal(out, indexer.index_topk_reference(q, w, pool, entries, 7)[0])
    ik.logits(q, w, pool, entries, scores, config=cfg, hist=hist)
    with pytest.raises(ValueError, match="power of two"):
        ik.select(scores, entries.visible, out, E, config=dataclasses.replace(cfg, select_split=3), hist=hist)


@CPU_ONLY
def test_few_picks_take_the_narrow_sort():
    """k=12 (a 16-wide sort): tokens with <= 8 picks take the 8-wide sort and write -1 to slots 8..11 themselves;
    the others the full one. Both kinds of token are in the step, and every row equals the reference's."""
    q, w, pool, entries = _case("plain", PREFILL_ROWS, torch.float64, seed=14)
    assert ik._small_sort(12) == 8
    picks = entries.visible.clamp(max=12)
    assert bool((picks <= 8).any()) and bool((picks > 8).any())
    got = _same(q, w, pool, entries, 12)[0]
    assert torch.equal((got >= 0).sum(1), picks)


@CPU_ONLY
def test_token_chunks_of_the_score_buffer(monkeypatch):
    """A score budget smaller than the step: chunks of tokens, same result."""
    q, w, pool, entries = _case("mxfp4", PREFILL_ROWS, torch.float64, seed=10)
    whole = ik.index_topk(q, w, pool, entries, 7, publish=3, block=4)
    monkeypatch.setattr(ik, "SCORE_BUDGET", 4 * (33 + 9) * 5)  # 5 tokens' score rows (33 entries, 9 blocks) at a time
    chunked = _same(q, w, pool, entries, 7, check_scores=False, publish=3, block=4)
    assert torch.equal(chunked[0], whole[0]) and torch.equal(chunked[1], whole[1])


@CPU_ONLY
def test_work_follows_visible_not_e_max():
    """Doubling E_max (the static bound) changes no pick; the logits kernel writes only j < visible of the score
    rows, and the select reads nothing else: +inf planted beyond the visible part is never picked."""
    q, w, pool, entries = _case("mxfp4", PREFILL_ROWS, torch.float64, seed=11)
    E = entries.max_entries
    base = ik.index_topk(q, w, pool, entries, 6)[0]
    wide = indexer.Entries(entries.block_table, entries.token_row, entries.visible, RATIO, BLOCK_SIZE, N_BLOCKS, 2 * E)
    assert torch.equal(ik.index_topk(q, w, pool, wide, 6)[0], base)
    scores = torch.full((q.shape[0], 2 * E), float("inf"))
    got = ik.index_topk(q, w, pool, wide, 6, scores_out=scores)[0]
    assert torch.equal(got, base)
    beyond = torch.arange(2 * E)[None, :] >= entries.visible[:, None]
    assert torch.isinf(scores[beyond]).all() and torch.isfinite(scores[~beyond]).all()


@CPU_ONLY
def test_entry_point_dispatches():
    q, w, pool, entries = _case("mxfp4", PREFILL_ROWS, torch.float64, seed=12)
    args = (q, w, pool, entries, 6)
    got = indexer.index_topk(*args, backend=backend.TRITON)
    assert torch.equal(got[0], ik.index_topk(*args)[0])
    assert torch.equal(indexer.index_topk(*args, backend=backend.REFERENCE)[0],
                       indexer.index_topk_reference(*args)[0])
    assert ik.supports(q, w, pool, entries, None, 0, 1, None)
    # formats and shapes the kernels do not take fall back to the reference
    nv = RowPool(Codec("nvfp4", 32), pool.rows, "cpu")
    assert not ik.supports(q, w, nv, entries, None, 0, 1, None)
    assert not ik.supports(q, w, pool, entries, None, 3, 3, None)  # candidate blocks of 3 entries
    cands = torch.zeros(q.shape[0], 2, dtype=torch.long)
    assert ik.supports(q, w, pool, entries, cands, 0, 4, None)
    assert not ik.supports(q, w, pool, entries, cands, 3, 4, None)  # publishing and masking at once
    nv.data[:] = Codec("nvfp4", 32).encode(torch.randn(nv.data.shape[0], 32, dtype=torch.float64))
    assert torch.equal(indexer.index_topk(q, w, nv, entries, 6, backend=backend.TRITON)[0],
                       indexer.index_topk_reference(q, w, nv, entries, 6)[0])


# The logits kernel compiled for sm_90 (tests/ops/sm90_compile.py: Triton's ptxas, no GPU): the widest global load or
# async copy at each record-load line of `_key_tile`, for records whose stride is aligned to 4 B only.
SM90_RECORD_LOADS = """
import inspect, json, re, triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from v4serve.ops.kernels import indexer as ik
src, first = inspect.getsourcelines(ik._key_tile.fn)
lines = {first + i for i, l in enumerate(src) if "tl.load(base" in l or "tl.load((rec + D)" in l}
out = {}
for name, fmt, cand, raw, stride in (("mxfp4", 1, False, False, 68), ("mxfp4+cand", 1, True, False, 68),
                                     ("fp8_row", 2, False, False, 132), ("fp8_row+fp8q", 2, False, True, 132),
                                     ("fp8_row+cand", 2, True, False, 132)):
    const = dict(H=64, H_PAD=64, D=128, RATIO=4, BLOCK_SIZE=256, BLOCK_T=1, BLOCK_E=64, CB=8 if cand else 1,
                 FORMAT=fmt, CAND=cand, PUBLISH=False, QFP8=raw, RAW_FP8=raw, KEY=tl.bfloat16,
                 DOT=tl.float8e4nv if raw else tl.bfloat16, ACC=tl.float32, ROUND_BF16=False, PDL=True,
                 REC_ALIGN=ik._alignment(stride), HIST=not cand, W_SCALED=True, W_ROUND=True, W_DT=tl.bfloat16)
    ptrs = {"q_ptr": "*fp8e4nv" if raw else "*bf16", "qs_ptr": "*fp32", "w_ptr": "*fp32", "data_ptr": "*u8",
            "bt_ptr": "*i64", "row_ptr": "*i64", "vis_ptr": "*i64", "cand_ptr": "*i64", "out_ptr": "*fp32",
            "blk_ptr": "*fp32", "hist_ptr": "*i32"}
    sig, attrs = {}, {}
    for i, n in enumerate(ik._logits_kernel.arg_names):
        sig[n] = "constexpr" if n in const else ptrs.get(n, "i32")
        if sig[n].startswith("*") or (n.startswith("stride") and n != "stride_row"):  # the pool's stride: 4-B
            attrs[(i,)] = [["tt.divisibility", 16]]
    ptx = triton.compile(ASTSource(ik._logits_kernel, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                         options={"num_warps": 4, "num_stages": 2}).asm["ptx"]
    files = {k: v for k, v in re.findall(r'[.]file\\s+(\\d+)\\s+"[^"]*?([^/"]+)"', ptx)}
    widest, here = 0, False
    for line in ptx.splitlines():
        m = re.match(r"\\s*[.]loc\\s+(\\d+)\\s+(\\d+)", line)
        if m:
            here = files.get(m.group(1)) == "indexer.py" and int(m.group(2)) in lines
            continue
        if not here:
            continue
        cp = re.search(r"cp[.]async[.]c[ag][.]shared[.]global.*, (0x[0-9a-f]+|\\d+)", line)
        ld = re.search(r"ld[.]global(?:[.]\\w+)*?(?:[.]v(\\d))?[.][bsuf](\\d+)", line)
        if cp:
            widest = max(widest, int(cp.group(1), 0))
        elif ld:
            widest = max(widest, int(ld.group(1) or 1) * int(ld.group(2)) // 8)
    out[name] = widest
print(json.dumps(out))
"""


def test_record_loads_are_no_wider_than_the_record_alignment_on_sm90() -> None:
    """FP8-row records are 132 B and MXFP4 records 68 B apart: a record start is 4-B aligned only. Triton's axis
    analysis once credited the row index with the alignment of its block-aligned terms, and the record loads came
    out as 8- and 16-byte vectors: "misaligned address" on the H200 in five of the eight GPU cases below. The
    REC_ALIGN hint keeps every record load at <= 4 B; the check runs on the CPU (sm_90 PTX from Triton's ptxas)."""
    widest = json.loads(run_compile(SM90_RECORD_LOADS).strip().splitlines()[-1])
    assert set(widest) == {"mxfp4", "mxfp4+cand", "fp8_row", "fp8_row+fp8q", "fp8_row+cand"}
    assert all(0 < w <= 4 for w in widest.values()), widest


# --- on a GPU (V4SERVE_TEST_DEVICE=cuda*): real shapes, still exact on grid operands ----------------------------------
ON_GPU = torch.cuda.is_available() and os.environ.get("V4SERVE_TEST_DEVICE", "").startswith("cuda")


def _same_picks(got: torch.Tensor, want: torch.Tensor, sorted_picks: bool) -> bool:
    """The reference's picks: bit for bit where the select sorts them, else the same set per row and -1 in the same
    slots (the GPU defaults leave the picks in the order found: Config.select_sorted)."""
    if sorted_picks:
        return torch.equal(got, want)
    return torch.equal(got.sort(-1).values, want.sort(-1).values) and torch.equal(got >= 0, want >= 0)


def _gpu_sorted(t: int, candidates: bool = False) -> bool:
    return ik.default_config(t, candidates, True).select_sorted



def _gpu_case(kind: str, rows: list[tuple[int, int]], heads: int, seed: int, fp8_q: bool = False):
    """V4-sized operands on the GPU: d = 128, 256-position blocks, bf16 queries on a grid (FP8 with power-of-two row
    scales), MXFP4 keys of grid values / FP8-row keys with power-of-two scales: every product and sum is exact in
    float32, so tensor-core dots in any order must give the reference's scores bit for bit."""
    g = _gen(seed)
    d, bs = 128, 256
    blocks = sum(-(-(p + n) // bs) for p, n in rows) + 1
    codec = Codec(kind, d)
    pool = RowPool(codec, blocks * (bs // RATIO) + bs // RATIO - 1, "cpu")
    vals = _grid((pool.data.shape[0], d), g)
    if kind == "fp8_row":
        scale = torch.full((vals.shape[0], 1), 0.5, dtype=torch.float32)
        pool.data[:] = torch.cat([vals.to(torch.float8_e4m3fn).view(torch.uint8), scale.view(torch.uint8)], 1)
    else:
        pool.data[:] = codec.encode(vals)
    pool.data = pool.data.cuda()
    nb = max(-(-(p + n) // bs) for p, n in rows)
    bt = torch.full((len(rows), nb + 1), -1, dtype=torch.long)
    perm, used = torch.randperm(blocks - 1, generator=g), 0
    for r, (p, n) in enumerate(rows):
        k = -(-(p + n) // bs)
        bt[r, :k] = perm[used:used + k]
        used += k
    token_row = torch.cat([torch.full((n,), r, dtype=torch.long) for r, (_, n) in enumerate(rows)])
    pos = torch.cat([torch.arange(p, p + n) for p, n in rows])
    E = -(-max(p + n for p, n in rows) // RATIO)
    entries = indexer.Entries(bt.cuda(), token_row.cuda(), ((pos + 1) // RATIO).cuda(), RATIO, bs, blocks - 1, E)
    T = token_row.shape[0]
    q = _grid((T, heads, d), g, scale=0.125).cuda()
    w = _grid((T, heads), g, -4, 4, 0.5).float().cuda()
    if fp8_q:
        q_scale = (2.0 ** torch.randint(-2, 3, (T, heads), generator=g).float()).cuda()
        return q.to(torch.float8_e4m3fn), w, pool, entries, q_scale
    return q.bfloat16(), w, pool, entries, None


@pytest.mark.skipif(not ON_GPU, reason="needs V4SERVE_TEST_DEVICE=cuda* and a GPU")
@pytest.mark.parametrize("kind,fp8_q", [("mxfp4", False), ("fp8_row", False), ("fp8_row", True)],
                         ids=["mxfp4", "fp8", "fp8-fp8q"])
@pytest.mark.parametrize("shape", ["decode", "prefill", "chunk"])
def test_gpu_real_shapes(kind, fp8_q, shape):
    """64 heads, top-512: 32 decode rows at contexts up to 16K; a 700-token prefill chunk beside 2 decode rows (more
    than HIST_ROWS tokens: the plain radix); a 200-token chunk beside one decode row (the prefill tiles with the score
    bins)."""
    g = _gen(99)
    rows = ([(int(p), 1) for p in torch.randint(100, 16384, (32,), generator=g)] if shape == "decode" else
            [(12000, 700), (5000, 1), (16000, 1)] if shape == "prefill" else [(9000, 200), (15000, 1)])
    q, w, pool, entries, q_scale = _gpu_case(kind, rows, 64, seed=13, fp8_q=fp8_q)
    got = ik.index_topk(q, w, pool, entries, 512, q_scale=q_scale)[0]
    want = indexer.index_topk_reference(q, w, pool, entries, 512, q_scale=q_scale)[0]
    assert _same_picks(got, want, _gpu_sorted(q.shape[0]))


@pytest.mark.skipif(not ON_GPU, reason="needs V4SERVE_TEST_DEVICE=cuda* and a GPU")
def test_gpu_candidate_level():
    """V4.1 shapes: 32 heads, blocks of 8 entries, 64 published blocks, then a selection inside them."""
    rows = [(9000, 300), (3000, 1), (15000, 1)]
    q, w, pool, entries, _ = _gpu_case("mxfp4", rows, 32, seed=14)
    got = ik.index_topk(q, w, pool, entries, 512, publish=64, block=8)
    want = indexer.index_topk_reference(q, w, pool, entries, 512, publish=64, block=8)
    # the published blocks as well: unsorted, they are in the order found (the candidate mask is a set)
    sorted_picks = _gpu_sorted(q.shape[0])
    assert _same_picks(got[0], want[0], sorted_picks) and _same_picks(got[1], want[1], sorted_picks)
    got = ik.index_topk(q.flip(0), w, pool, entries, 256, candidates=want[1], block=8)[0]
    assert _same_picks(got, indexer.index_topk_reference(q.flip(0), w, pool, entries, 256, want[1], 0, 8)[0],
                       _gpu_sorted(q.shape[0], candidates=True))


@pytest.mark.skipif(not ON_GPU, reason="needs V4SERVE_TEST_DEVICE=cuda* and a GPU")
@pytest.mark.parametrize("change", [{"select_narrow": True}, {"select_digit": 5},
                                    {"select_resident": True, "select_block": 4096, "select_hist": False},
                                    {"select_narrow": True, "select_digit": 5, "select_resident": True,
                                     "select_hist": False},
                                    {"select_hist": False}, {"select_cap": 8}, {"select_sorted": False},
                                    {"select_sorted": True}, {"select_split": 8},
                                    {"select_split": 4, "select_block": 2048, "select_warps": 8,
                                     "select_sorted": True}, {"select_split": 16, "select_cap": 8}],
                         ids=["narrow", "digit5", "resident", "all", "no-bins", "cap8", "unsorted", "sorted", "split8",
                              "split4-sorted", "split16-cap8"])
def test_gpu_select_variants(change):
    """The select's variants beside the GPU default (the narrow sort, 5-bit digits, keys kept in registers, the
    plain radix, the picks sorted or left in the order found, the binned select over several programs a token) at
    real shapes: 32 decode rows whose picks range from 30 to 512, and V4.1's 2048 candidate blocks of a short context;
    the reference's picks (as sets where left unsorted)."""
    g = _gen(98)
    rows = [(int(p), 1) for p in torch.randint(100, 4000, (32,), generator=g)]
    q, w, pool, entries, _ = _gpu_case("mxfp4", rows, 64, seed=16)
    cfg = dataclasses.replace(ik.default_config(q.shape[0], False, True), **change)
    def same(a: torch.Tensor, b: torch.Tensor) -> bool:
        return _same_picks(a, b, cfg.select_sorted)
    want = indexer.index_topk_reference(q, w, pool, entries, 512)[0]
    assert same(ik.index_topk(q, w, pool, entries, 512, config=cfg)[0], want)
    rows = [(3000, 1), (1200, 1)]
    q, w, pool, entries, _ = _gpu_case("mxfp4", rows, 32, seed=17)
    got = ik.index_topk(q, w, pool, entries, 512, publish=2048, block=8, config=cfg)
    want = indexer.index_topk_reference(q, w, pool, entries, 512, publish=2048, block=8)
    assert same(got[0], want[0]) and same(got[1], want[1])


@pytest.mark.skipif(not ON_GPU, reason="needs V4SERVE_TEST_DEVICE=cuda* and a GPU")
@pytest.mark.parametrize("split", [1, 8], ids=["one-program", "select-split8"])
def test_gpu_graph_replay(split):
    """Captured once, replayed on new queries and visible counts: no host synchronisation inside (the split select:
    its arrival counters and score bins left zeroed for each replay)."""
    rows = [(int(p), 1) for p in range(1000, 16000, 1900)]
    q, w, pool, entries, _ = _gpu_case("mxfp4", rows, 64, seed=15)
    cfg = dataclasses.replace(ik.default_config(q.shape[0], False, True), select_split=split)
    ik.index_topk(q, w, pool, entries, 512, config=cfg)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ik.index_topk(q, w, pool, entries, 512, config=cfg)[0]
    for seed in range(3):
        q.copy_(_gpu_case("mxfp4", rows, 64, seed=100 + seed)[0])
        entries.visible.sub_(seed * 7).clamp_(min=0)
        graph.replay()
        assert _same_picks(out, indexer.index_topk_reference(q, w, pool, entries, 512)[0], cfg.select_sorted)
