"""Chunked prefill, multi-row steps and decode give the same logits as one prefill over the same tokens.

The engine splits prompts into chunks of any length at any position and batches them with other requests'
decode tokens in one step. The model carries the sliding-window rings and the compressor partial groups (CSA
with its overlap, HCA) across steps, so none of this may change a single logit beyond float rounding. The tiny
presets have a 16-token window, CSA ratio 4 (top-4 indexer) and HCA ratio 8, so ~130 tokens cross many windows,
groups and block boundaries.
"""

from __future__ import annotations

import random

import pytest
import torch
from helpers import (
    PRESETS,
    blocks_for,
    max_rel_err,
    new_pools,
    one_shot,
    preset_model,
    rel_err,
    tokens,
)

from v4serve.models.step import RowSpec, build_step

TOL = 1e-4
# Equivalence is checked in float64: the reference's FP8/FP4 simulations are discontinuous, so float32 rounding that
# differs between GEMM shapes (it does on some CPUs) could flip one quantization step and move a logit by ~1e-2.
EXACT = torch.float64
N = 130


@pytest.fixture(scope="module")
def reference():
    """One-shot logits per (preset, prompt seed), deepseek numerics, float32 ('auto') cache."""
    cache: dict[tuple[str, int, int], torch.Tensor] = {}

    def get(preset: str, seed: int, n: int = N) -> torch.Tensor:
        key = (preset, seed, n)
        if key not in cache:
            cache[key] = one_shot(preset_model(preset, dtype=EXACT), tokens(n, seed))
        return cache[key]

    return get


def random_chunks(n: int, rng: random.Random) -> list[int]:
    """Chunk lengths summing to n: single tokens, short chunks and chunks longer than the window (16)."""
    out = []
    while sum(out) < n:
        out.append(min(rng.choice([1, 1, 2, 3, 5, 8, 13, 17, 31, 47]), n - sum(out)))
    return out


@torch.no_grad()
def run_chunked(lm, toks: list[int], chunks: list[int], pools, slot: int, blocks: list[int]) -> torch.Tensor:
    outs, s = [], 0
    for n in chunks:
        step = build_step([RowSpec(toks[s:s + n], s, slot, blocks, logits="all")])
        outs.append(lm.model(step, pools).logits)
        s += n
    return torch.cat(outs)


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_chunked_prefill_equals_one_shot(reference, preset, seed):
    lm = preset_model(preset, dtype=EXACT)
    rng = random.Random(seed)
    chunks = random_chunks(N, rng)
    assert len(chunks) > 4
    # another slot and non-contiguous physical blocks than the reference used
    blocks = rng.sample(range(4, 20), blocks_for(N))
    pools = new_pools(lm.config, dtype=EXACT)
    got = run_chunked(lm, tokens(N, seed), chunks, pools, slot=3, blocks=blocks)
    err = rel_err(got, reference(preset, seed))
    assert err.max().item() <= TOL, f"chunks {chunks}: worst position {int(err.argmax())} rel err {err.max():.3g}"


def mixed_schedule(lengths: list[int], rng: random.Random) -> list[list[tuple[int, int, int]]]:
    """Steps of (request, start, length): requests join at different steps, chunk lengths differ per row, and
    1-token rows (decode-shaped) share steps with multi-token prefill chunks."""
    join = [0, 0, 1, 3][: len(lengths)]
    pos = [0] * len(lengths)
    steps = []
    k = 0
    while any(p < n for p, n in zip(pos, lengths)):
        step = []
        for r, n in enumerate(lengths):
            if k < join[r] or pos[r] >= n:
                continue
            ln = min(rng.choice([1, 1, 1, 2, 4, 7, 16, 23, 40]), n - pos[r])
            step.append((r, pos[r], ln))
            pos[r] += ln
        steps.append(step)
        k += 1
    return steps


@pytest.mark.parametrize("preset", PRESETS)
def test_multi_row_steps_mixing_decode_rows_and_prefill_chunks(reference, preset):
    lm = preset_model(preset, dtype=EXACT)
    rng = random.Random(7)
    lengths = [N, 77, 101, 45]
    seeds = [0, 11, 12, 13]
    prompts = [tokens(n, s) for n, s in zip(lengths, seeds)]
    refs = [reference(preset, s, n) for n, s in zip(lengths, seeds)]
    slots = [4, 0, 2, 5]
    phys = rng.sample(range(23), sum(blocks_for(n) for n in lengths))
    blocks, i = [], 0
    for n in lengths:
        blocks.append(phys[i:i + blocks_for(n)])
        i += blocks_for(n)
    schedule = mixed_schedule(lengths, rng)
    # the schedule really mixes: some step has a 1-token row at a position > 0 beside a longer chunk
    assert any(any(ln == 1 and s > 0 for _, s, ln in st) and any(ln > 1 for _, _, ln in st) for st in schedule)
    assert max(len(st) for st in schedule) == len(lengths)

    pools = new_pools(lm.config, dtype=EXACT)
    got: list[list[torch.Tensor]] = [[] for _ in lengths]
    with torch.no_grad():
        for st in schedule:
            rows = [RowSpec(prompts[r][s:s + ln], s, slots[r], blocks[r], logits="all") for r, s, ln in st]
            logits = lm.model(build_step(rows), pools).logits
            off = 0
            for r, _, ln in st:
                got[r].append(logits[off:off + ln])
                off += ln
            assert off == logits.shape[0]
    for r in range(len(lengths)):
        err = max_rel_err(torch.cat(got[r]), refs[r])
        assert err <= TOL, f"request {r}: rel err {err:.3g}"


@pytest.mark.parametrize("preset", PRESETS)
def test_greedy_decode_after_prefill_equals_full_recompute(preset):
    lm = preset_model(preset, dtype=EXACT)
    prompt, steps = tokens(70, 21), 24
    pools = new_pools(lm.config, dtype=EXACT)
    blocks = [9, 3]
    with torch.no_grad():
        last = lm.model(build_step([RowSpec(prompt, 0, 2, blocks)]), pools).logits[0]
        seq, dec = list(prompt), [last]
        for i in range(steps):
            seq.append(int(dec[-1].argmax()))
            dec.append(lm.model(build_step([RowSpec([seq[-1]], len(seq) - 1, 2, blocks)]), pools).logits[0])
    full = one_shot(lm, seq)  # one prefill over prompt + generated tokens
    dec = torch.stack(dec)  # logits for positions 69 .. 69 + steps
    err = rel_err(dec, full[len(prompt) - 1:])
    assert err.max().item() <= TOL, f"decode step {int(err.argmax())}: rel err {err.max():.3g}"
    assert seq[len(prompt):] == full[len(prompt) - 1:-1].argmax(-1).tolist()


@pytest.mark.parametrize("preset", PRESETS)
def test_fp8_cache_under_deepseek_numerics_equals_auto_cache(reference, preset):
    """The reference simulates the FP8 KV (584-B record) and FP4 index-key (68-B) formats, so storing them is
    lossless: chunked prefill + multi-row decode with a quantized cache equals one-shot with a float cache."""
    lm = preset_model(preset, dtype=EXACT)
    pools = new_pools(lm.config, kv_dtype="fp8", dtype=EXACT)
    # the cache really stores quantized records
    c = lm.config
    csa = next(i for i in range(c.n_layers) if c.ratio(i) == 4)
    assert pools.window[0].codec.kind == "v4_fp8" and pools.window[0].data.dtype == torch.uint8
    assert pools.compressed[csa].codec.kind == "v4_fp8" and pools.index_keys[csa].codec.kind == "mxfp4"
    assert pools.window[0].data.shape[1] == (c.nope_dim + 2 * c.rope_dim + c.nope_dim // 64 + 1)

    a, b = tokens(N, 0), tokens(77, 11)
    rng = random.Random(3)
    ca, cb = random_chunks(N, rng), random_chunks(77, rng)
    got_a, got_b = [], []
    sa = sb = 0
    with torch.no_grad():
        while sa < N or sb < 77:
            rows, lens = [], []
            if sa < N:
                n = ca.pop(0)
                rows.append(RowSpec(a[sa:sa + n], sa, 1, [0, 1, 2], logits="all"))
                lens.append(("a", n))
                sa += n
            if sb < 77:
                n = cb.pop(0)
                rows.append(RowSpec(b[sb:sb + n], sb, 3, [5, 4], logits="all"))
                lens.append(("b", n))
                sb += n
            out = lm.model(build_step(rows), pools).logits
            off = 0
            for which, n in lens:
                (got_a if which == "a" else got_b).append(out[off:off + n])
                off += n
    assert max_rel_err(torch.cat(got_a), reference(preset, 0)) <= TOL
    assert max_rel_err(torch.cat(got_b), reference(preset, 11, 77)) <= TOL


def test_fp8_cache_is_lossy_without_the_simulation():
    """Control for the test above: under transformers numerics (no simulation) the same FP8 cache changes the
    logits, i.e. the quantized pools are really read back."""
    lm = preset_model("tiny-v4-flash", numerics="transformers", dtype=EXACT)
    toks = tokens(N, 0)
    auto = one_shot(lm, toks)
    pools = new_pools(lm.config, kv_dtype="fp8", dtype=EXACT)
    got = run_chunked(lm, toks, [40, 1, 50, 39], pools, slot=0, blocks=[0, 1, 2])
    assert max_rel_err(got, auto) > 1e-3


def test_mtp_forward_gives_finite_logits_of_the_right_shape():
    lm = preset_model("tiny-v4-flash", with_mtp=True, dtype=EXACT)
    c = lm.config
    toks = tokens(40, 5)
    pools = new_pools(c, with_mtp=True, dtype=EXACT)
    assert c.n_layers in pools.window  # the MTP block's window ring
    with torch.no_grad():
        main = lm.model(build_step([RowSpec(toks, 0, 0, [0], logits="all")]), pools)
        assert main.hidden.shape == (40, c.hc_mult, c.dim)
        nxt = toks[1:] + [int(main.logits[-1].argmax())]
        mtp = lm.model.mtp_forward(build_step([RowSpec(nxt, 0, 0, [0], logits="all")]), pools, main.hidden)
        assert mtp.logits.shape == (40, c.vocab_size)
        assert torch.isfinite(mtp.logits).all()
        # it uses the main model's streams, not only the next-token embeddings
        pools2 = new_pools(c, with_mtp=True, dtype=EXACT)
        other = lm.model.mtp_forward(build_step([RowSpec(nxt, 0, 0, [0], logits="all")]), pools2,
                                     torch.zeros_like(main.hidden))
        assert (other.logits - mtp.logits).abs().max() > 1e-3
        # and, like the trunk, chunking it does not change its logits
        pools3 = new_pools(c, with_mtp=True, dtype=EXACT)
        parts = []
        for s, e in ((0, 17), (17, 18), (18, 40)):
            h = lm.model(build_step([RowSpec(toks[s:e], s, 1, [1], logits="all")]), pools3).hidden
            parts.append(lm.model.mtp_forward(build_step([RowSpec(nxt[s:e], s, 1, [1], logits="all")]), pools3,
                                              h).logits)
    assert max_rel_err(torch.cat(parts), mtp.logits) <= TOL
