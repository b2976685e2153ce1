"""Batched sampler: greedy, seeded reproducibility, distribution, truncation, penalties, logprobs."""

from __future__ import annotations

import math
import os
import random

import pytest
import torch

from v4serve.engine import sampler
from v4serve.engine.sampler import SamplerOutput, SamplingBatch
from v4serve.engine.sampling_params import SamplingParams

EOS = 1
# V4SERVE_TEST_DEVICE=cuda runs the same checks on the GPU (inputs built on CPU, moved there)
DEVICE = os.environ.get("V4SERVE_TEST_DEVICE", "cpu")


def build(params: list[SamplingParams], vocab: int, **kw) -> SamplingBatch:
    kw.setdefault("device", DEVICE)
    return SamplingBatch.build(params, vocab_size=vocab, eos_id=EOS, **kw)


def sample(logits: torch.Tensor, batch: SamplingBatch) -> SamplerOutput:
    out = sampler.sample(logits.to(batch.seeds.device), batch)
    cpu = [
        None if t is None else t.cpu() for t in (out.token_ids, out.logprobs, out.top_ids, out.top_logprobs)
    ]
    return SamplerOutput(*cpu)


def process_logits(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    return sampler.process_logits(logits.to(batch.seeds.device), batch).cpu()


def truncate_logits(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    return sampler.truncate_logits(logits.to(batch.seeds.device), batch).cpu()


def uniform_noise(seeds: torch.Tensor, steps: torch.Tensor, vocab: int) -> torch.Tensor:
    return sampler.uniform_noise(seeds.to(DEVICE), steps.to(DEVICE), vocab).cpu()


def gumbel_noise(seeds: torch.Tensor, steps: torch.Tensor, vocab: int) -> torch.Tensor:
    return sampler.gumbel_noise(seeds.to(DEVICE), steps.to(DEVICE), vocab).cpu()


def chi_square(counts: list[int], probs: list[float]) -> float:
    n = sum(counts)
    return sum((c - n * p) ** 2 / (n * p) for c, p in zip(counts, probs) if p > 0)


# --- greedy ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_greedy_is_argmax_in_any_float_dtype(dtype: torch.dtype) -> None:
    logits = torch.randn(6, 500, generator=torch.Generator().manual_seed(0)).to(dtype)
    out = sample(logits, build([SamplingParams(temperature=0.0, seed=i) for i in range(6)], 500))
    assert torch.equal(out.token_ids, logits.float().argmax(-1))


def test_greedy_ties_go_to_the_lowest_id() -> None:
    logits = torch.zeros(3, 50)
    logits[0, [7, 3, 40]] = 5.0
    logits[1, [49, 20]] = 2.0
    out = sample(logits, build([SamplingParams(temperature=0.0, top_k=5, top_p=0.5)] * 3, 50))
    assert out.token_ids.tolist() == [3, 20, 0]


# --- seeds ----------------------------------------------------------------------------------------
def test_seeded_request_is_reproducible_in_any_batch_position_and_company() -> None:
    vocab, steps = 1000, 8
    gen = torch.Generator().manual_seed(1)
    mine = SamplingParams(temperature=0.9, top_p=0.95, seed=1234)
    others = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.3, top_k=20, presence_penalty=0.5, repetition_penalty=1.2),
        SamplingParams(min_p=0.2, frequency_penalty=1.0, logprobs=5),
        SamplingParams(temperature=0.7, seed=99, min_tokens=100),
        SamplingParams(),  # unseeded
    ]
    alone, together = [], []
    history: list[int] = []
    for _ in range(steps):
        row = torch.randn(vocab, generator=gen) * 2
        noise_rows = torch.randn(len(others), vocab, generator=gen)
        alone.append(sample(row[None], build([mine], vocab, output_ids=[history])).token_ids.item())
        batch = [*others[:3], mine, *others[3:]]
        logits = torch.cat([noise_rows[:3], row[None], noise_rows[3:]])
        outputs = [[5, 6, 7]] * 3 + [history] + [[8]] * 2
        together.append(
            sample(logits, build(batch, vocab, output_ids=outputs, prompt_ids=[[9]] * 6)).token_ids[3].item()
        )
        history.append(alone[-1])
    assert alone == together


def test_different_seeds_give_different_streams_and_unseeded_rows_are_fresh() -> None:
    vocab, rows, steps = 1000, 8, 6
    logits = torch.zeros(rows, vocab)  # uniform: any two streams agreeing is a 1e-3 event per token

    def streams(params: list[SamplingParams]) -> list[tuple[int, ...]]:
        out = [
            sample(logits, build(params, vocab, steps=[t] * rows)).token_ids.tolist() for t in range(steps)
        ]
        return list(zip(*out))

    seeded = streams([SamplingParams(seed=s) for s in range(rows)])
    assert len(set(seeded)) == rows
    assert seeded == streams([SamplingParams(seed=s) for s in range(rows)])
    assert streams([SamplingParams()] * rows) != streams([SamplingParams()] * rows)
    assert len(set(streams([SamplingParams()] * rows))) == rows


def test_noise_stream_is_pinned() -> None:
    # Seeded outputs are a user-visible contract: this pins the hash against a plain-int reference
    # (and checks int64 wraparound and masked shifts behave as intended).
    mask = (1 << 62) - 1
    mul1, mul2 = 0xBF58476D1CE4E5B9 & mask, 0x94D049BB133111EB & mask
    golden = 0x9E3779B97F4A7C15 & mask

    def mix(x: int) -> int:
        x ^= x >> 31
        x = (x * mul1) & mask
        x ^= x >> 29
        x = (x * mul2) & mask
        return x ^ (x >> 32)

    seeds = [0, 1, 42, (1 << 62) - 1, 2**61 + 12345, -7 & mask]
    steps = [0, 3, 1, 1000000, 7, 2**40]
    u = uniform_noise(torch.tensor(seeds), torch.tensor(steps), 300)
    for r, (seed, step) in enumerate(zip(seeds, steps)):
        key = mix((mix(seed) + (step + 1) * golden) & mask)
        for v in (0, 1, 17, 299):
            h = mix((key + v * golden) & mask)
            assert u[r, v].item() == (2 * (h >> 39) + 1) / 2**24


def test_uniform_noise_is_uniform_and_open_interval() -> None:
    u = uniform_noise(torch.arange(64), torch.arange(64) * 3, 4096).flatten()
    assert 0.0 < u.min().item() and u.max().item() < 1.0
    counts = torch.histc(u, bins=32, min=0.0, max=1.0).tolist()
    assert chi_square([int(c) for c in counts], [1 / 32] * 32) < 61.1  # p = 0.001, 31 dof
    g = gumbel_noise(torch.tensor([5]), torch.tensor([0]), 100000)
    assert abs(g.mean().item() - 0.5772) < 0.02  # Euler-Mascheroni: the Gumbel mean


# --- distribution ---------------------------------------------------------------------------------
LOGITS10 = [2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, 3.0, 0.2, -2.0]


def test_samples_follow_softmax_of_logits_over_temperature() -> None:
    n, temp = 20000, 0.7
    probs = torch.softmax(torch.tensor(LOGITS10) / temp, -1).tolist()
    logits = torch.tensor(LOGITS10).repeat(n, 1)
    # many requests with distinct seeds in one batch ...
    by_seed = sample(logits, build([SamplingParams(temperature=temp, seed=s) for s in range(n)], 10))
    # ... and one seeded request over many steps
    one = [SamplingParams(temperature=temp, seed=77)] * n
    by_step = sample(logits, build(one, 10, steps=list(range(n))))
    for out in (by_seed, by_step):
        counts = torch.bincount(out.token_ids, minlength=10).tolist()
        assert chi_square(counts, probs) < 27.9  # p = 0.001 with 9 dof; seeds fixed, so not flaky


def test_truncated_samples_follow_the_renormalised_distribution() -> None:
    n = 20000
    params = SamplingParams(temperature=1.0, top_k=6, top_p=0.8, seed=3)
    batch = build([params] * n, 10, steps=list(range(n)))
    logits = torch.tensor(LOGITS10).repeat(n, 1)
    kept = reference_keep(LOGITS10, 6, 0.8, 0.0)
    z = sum(math.exp(LOGITS10[i]) for i in kept)
    probs = [math.exp(x) / z if i in kept else 0.0 for i, x in enumerate(LOGITS10)]
    counts = torch.bincount(sample(logits, batch).token_ids, minlength=10).tolist()
    assert all(c == 0 for i, c in enumerate(counts) if i not in kept)
    assert chi_square(counts, probs) < 3 * len(kept) + 10


# --- truncation -----------------------------------------------------------------------------------
def reference_keep(logits: list[float], top_k: int, top_p: float, min_p: float) -> set[int]:
    """Plain-Python top-k -> top-p -> min-p, in float64."""
    order = sorted(range(len(logits)), key=lambda i: (-logits[i], i))
    if top_k > 0:
        order = order[:top_k]
    z = sum(math.exp(logits[i] - logits[order[0]]) for i in order)
    probs = [math.exp(logits[i] - logits[order[0]]) / z for i in order]
    if top_p < 1.0:
        kept, mass = [], 0.0
        for i, p in zip(order, probs):
            if mass >= top_p:
                break
            kept.append(i)
            mass += p
        order = kept
    best = max(logits[i] for i in order)
    return {i for i in order if math.exp(logits[i] - best) >= min_p}


def test_top_k_top_p_min_p_remove_exactly_the_reference_tokens() -> None:
    rng = random.Random(11)
    vocab, rows = 64, 200
    params = [
        SamplingParams(
            temperature=rng.choice([1.0, 0.5, 2.0]),
            top_k=rng.choice([0, -1, 1, 2, 5, 17, 63, 64, 100]),
            top_p=rng.choice([1.0, 0.999, 0.9, 0.5, 0.2, 0.01]),
            min_p=rng.choice([0.0, 0.0, 0.05, 0.3, 0.9]),
        )
        for _ in range(rows)
    ]
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(5)) * 3
    batch = build(params, vocab)
    processed = process_logits(logits, batch)
    kept = torch.isfinite(truncate_logits(processed, batch))
    for r, p in enumerate(params):
        row = processed[r].double().tolist()
        want = reference_keep(row, p.effective_top_k, p.top_p, p.min_p)
        assert set(kept[r].nonzero().flatten().tolist()) == want, (r, p)
    # sampled tokens always come from the kept set
    ids = sample(logits, build([p.clone(seed=r) for r, p in enumerate(params)], vocab)).token_ids
    assert kept[torch.arange(rows), ids].all()


def test_min_p_alone_skips_the_sort_but_keeps_the_same_tokens() -> None:
    logits = torch.randn(4, 100, generator=torch.Generator().manual_seed(2))
    only = build([SamplingParams(min_p=0.3)] * 4, 100)
    mixed = build([SamplingParams(min_p=0.3)] * 3 + [SamplingParams(top_k=100, top_p=0.99999)], 100)
    a = truncate_logits(logits, only)
    b = truncate_logits(logits, mixed)
    assert torch.equal(torch.isfinite(a[:3]), torch.isfinite(b[:3]))


# --- penalties and banned tokens ------------------------------------------------------------------
def test_penalties_follow_the_vllm_formulas() -> None:
    raw = [2.0, -1.0, 0.5, 3.0, -2.0, 1.0]
    p = SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    batch = build([p, SamplingParams()], 6, output_ids=[[0, 0, 2], [0, 0, 2]], prompt_ids=[[4], [4]])
    got = process_logits(torch.tensor([raw, raw]), batch)
    counts = {0: 2, 2: 1}
    seen = {0, 2, 4}  # prompt and output tokens, for the repetition penalty
    want = []
    for i, x in enumerate(raw):
        if i in seen:
            x = x / 2.0 if x > 0 else x * 2.0
        c = counts.get(i, 0)
        want.append(x - 0.5 * c - 0.25 * (c > 0))
    assert got[0].tolist() == pytest.approx(want)
    assert torch.equal(got[1], torch.tensor(raw))  # no penalties: untouched


def test_min_tokens_bans_eos_and_stop_ids_until_reached() -> None:
    vocab = 20
    logits = torch.zeros(3, vocab)
    logits[:, EOS] = 10.0
    logits[:, 7] = 9.0
    logits[:, 3] = 8.0
    p = SamplingParams(temperature=0.0, min_tokens=4, stop_token_ids=[7])
    out = sample(logits, build([p] * 3, vocab, output_ids=[[5] * 2, [5] * 3, [5] * 4]))
    assert out.token_ids.tolist() == [3, 3, EOS]
    # banned tokens carry no probability mass: 3 competes with the 17 zero logits only
    assert out.logprobs[0].item() == pytest.approx(8.0 - math.log(math.exp(8.0) + 17), abs=1e-5)
    ignore = SamplingParams(temperature=0.0, min_tokens=4, ignore_eos=True)
    assert sample(logits[:1], build([ignore], vocab, output_ids=[[]])).token_ids.item() == EOS


# --- logprobs -------------------------------------------------------------------------------------
def test_logprobs_are_of_the_tempered_penalised_distribution() -> None:
    vocab = 300
    logits = torch.randn(4, vocab, generator=torch.Generator().manual_seed(8)) * 2
    params = [
        SamplingParams(temperature=0.5, logprobs=3, seed=1),
        SamplingParams(temperature=0.0, logprobs=7),
        SamplingParams(top_k=5, seed=2),  # no logprobs asked: still gets the chosen one
        SamplingParams(presence_penalty=1.5, logprobs=0, seed=3),
    ]
    batch = build(params, vocab, output_ids=[[], [], [], [10, 11]])
    out = sample(logits, batch)
    expected = torch.log_softmax(process_logits(logits, batch), -1)
    assert torch.allclose(out.logprobs, expected.gather(1, out.token_ids[:, None]).squeeze(1), atol=1e-5)
    assert out.top_ids.shape == (4, 7) and out.top_logprobs.shape == (4, 7)
    values, ids = expected.topk(7, dim=-1)
    assert torch.equal(out.top_ids, ids) and torch.allclose(out.top_logprobs, values, atol=1e-5)
    # temperature 0.5 sharpens row 0; row 3's penalty lowers tokens 10 and 11
    assert expected[0].max() > torch.log_softmax(logits[0], -1).max()
    assert torch.all(expected[3, 10:12] < torch.log_softmax(logits[3], -1)[10:12])


def test_without_logprobs_requests_no_top_alternatives_are_computed() -> None:
    out = sample(torch.randn(2, 50), build([SamplingParams(seed=1), SamplingParams(logprobs=0)], 50))
    assert out.top_ids is None and out.top_logprobs is None and out.logprobs.shape == (2,)


def test_full_vocabulary_batch() -> None:
    vocab = 129280
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(0), dtype=torch.float32)
    params = [
        SamplingParams(temperature=0.6, top_p=0.95, top_k=40, seed=1, logprobs=20),
        SamplingParams(temperature=0.0),
        SamplingParams(min_p=0.1, seed=2),
    ]
    out = sample(logits.bfloat16(), build(params, vocab))
    assert out.token_ids[1].item() == logits.bfloat16().float()[1].argmax().item()
    assert out.top_ids.shape == (3, 20) and bool(torch.all(out.logprobs <= 0))


# --- CUDA graph capture ---------------------------------------------------------------------------
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_sample_captures_in_a_cuda_graph_without_host_sync() -> None:
    vocab, rows = 4096, 8
    params = [
        SamplingParams(
            temperature=0.8,
            top_k=50,
            top_p=0.9,
            min_p=0.01,
            presence_penalty=0.3,
            repetition_penalty=1.1,
            seed=i,
            logprobs=4,
            min_tokens=3,
        )
        for i in range(rows)
    ]
    batch = build(params, vocab, device="cuda", output_ids=[[1, 2]] * rows, prompt_ids=[[3]] * rows)
    logits = torch.randn(rows, vocab, device="cuda")
    torch.cuda.set_sync_debug_mode("error")
    try:
        eager = sampler.sample(logits, batch)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        sampler.sample(logits, batch)  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = sampler.sample(logits, batch)
    graph.replay()
    assert torch.equal(captured.token_ids, eager.token_ids)
    assert torch.equal(captured.top_ids, eager.top_ids)
    # new inputs copied into the static tensors: the graph follows them
    logits.copy_(torch.randn(rows, vocab, device="cuda"))
    batch.steps.add_(1)
    graph.replay()
    assert torch.equal(captured.token_ids, sampler.sample(logits, batch).token_ids)


# --- stages a step can skip ---------------------------------------------------------------------------------------------
def test_without_chosen_logprobs_the_tokens_are_the_same() -> None:
    """`chosen_logprobs` off (the runner's choice when no row asks for logprobs): the same tokens, greedy and seeded
    rows alike, and no logprobs (no log-sum-exp over the vocabulary)."""
    logits = torch.randn(5, 700, generator=torch.Generator().manual_seed(3))
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, seed=4),
              SamplingParams(temperature=1.0, top_p=0.9, seed=5), SamplingParams(temperature=0.0, presence_penalty=1.0),
              SamplingParams(temperature=1.3, top_k=20, seed=6)]
    outputs = [[3, 4], [], [9, 9, 2], [7], []]
    full = sample(logits, build(params, 700, output_ids=outputs))
    lean_batch = build(params, 700, output_ids=outputs)
    lean_batch.chosen_logprobs = False
    lean = sample(logits, lean_batch)
    assert torch.equal(lean.token_ids, full.token_ids) and full.logprobs is not None
    assert lean.logprobs is None and lean.top_ids is None
    with_top = build([SamplingParams(temperature=0.0, logprobs=2)], 700)
    with_top.chosen_logprobs = False  # top alternatives asked for: the chosen logprob comes with them
    assert sample(logits[:1], with_top).logprobs is not None


def test_unit_temperature_skips_the_division_and_changes_no_bit() -> None:
    """Greedy rows and temperature-1 rows divide by 1: the batch skips the division, with the same processed logits
    as dividing; any other temperature in the batch keeps it."""
    logits = torch.randn(3, 300, generator=torch.Generator().manual_seed(8))
    unit = build([SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, seed=1),
                  SamplingParams(temperature=0.0, repetition_penalty=1.2)], 300, prompt_ids=[[5], [6], [7, 8]])
    assert unit.unit_temperature
    divided = sampler.process_logits(logits.to(unit.seeds.device),
                                     SamplingBatch(**{**unit.__dict__, "unit_temperature": False}))
    assert torch.equal(process_logits(logits, unit), divided.cpu())
    assert not build([SamplingParams(temperature=0.0), SamplingParams(temperature=0.7, seed=2)], 300).unit_temperature


@pytest.mark.parametrize("chunk", [4, 10, 640])
def test_chunked_argmax_is_torch_argmax_ties_nan_and_all_banned_included(chunk: int) -> None:
    """The greedy pick over vocabulary chunks (`first_argmax` on a GPU) is torch.argmax's: the first maximal index
    where a maximum repeats inside a chunk and across chunks, a NaN as the largest, a row all -inf -> 0."""
    from v4serve.engine.sampler import chunked_argmax

    g = torch.Generator().manual_seed(3)
    vocab = chunk * 24
    x = torch.randint(0, 5, (9, vocab), generator=g).float()  # few distinct values: ties everywhere
    x[1, [chunk + 2, chunk - 1, 5 * chunk]] = 9.0  # repeats across chunks, the first in chunk 0 unless chunk <= 2
    x[2, [3 * chunk + 1, 3 * chunk]] = 9.0  # inside one chunk
    x[3] = float("-inf")
    x[4, [7 * chunk + 3, 2 * chunk]] = float("nan")
    for dtype in (torch.float32, torch.bfloat16):
        y = x.to(dtype)
        assert torch.equal(chunked_argmax(y, chunk), torch.argmax(y, dim=-1))
    assert chunked_argmax(x, chunk)[3].item() == 0


def test_first_argmax_chunks_the_full_vocabulary() -> None:
    """129,280 logits split into 202 chunks of 640 (the smallest divisor from 512); a vocabulary without one in
    512-4096 keeps torch.argmax."""
    from v4serve.engine.sampler import _chunk

    assert _chunk(129280) == 640 and 129280 // 640 == 202
    assert _chunk(500) == 0 and _chunk(7919) == 0
