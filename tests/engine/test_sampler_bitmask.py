"""The sampler's structured-output mask: one [rows, V/32] bitmask, applied to the constrained rows only."""

from __future__ import annotations

import os

import pytest
import torch

from v4serve.engine import sampler
from v4serve.engine.sampler import SamplingBatch, bitmask_bias
from v4serve.engine.sampling_params import SamplingParams

DEVICE = os.environ.get("V4SERVE_TEST_DEVICE", "cpu")
EOS = 1


def pack(allowed: torch.Tensor) -> torch.Tensor:
    """[R, V] bool -> [R, ceil(V / 32)] int32, bit j of word w = token 32 w + j (xgrammar's layout)."""
    rows, vocab = allowed.shape
    padded = torch.zeros(rows, -(-vocab // 32) * 32, dtype=torch.int64)
    padded[:, :vocab] = allowed.long()
    words = (padded.view(rows, -1, 32) << torch.arange(32)).sum(-1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def masked_batch(params: list[SamplingParams], vocab: int, allowed: torch.Tensor, rows: list[int]) -> SamplingBatch:
    batch = SamplingBatch.build(params, vocab_size=vocab, device=DEVICE, eos_id=EOS)
    batch.bitmask = pack(allowed).to(DEVICE)
    batch.bitmask_rows = torch.tensor(rows, dtype=torch.int64, device=DEVICE)
    return batch


@pytest.mark.parametrize("vocab", [64, 100, 129280])
def test_bias_is_zero_where_allowed_and_minus_inf_elsewhere(vocab: int) -> None:
    g = torch.Generator().manual_seed(vocab)
    allowed = torch.rand(3, vocab, generator=g) < 0.3
    bias = bitmask_bias(pack(allowed).to(DEVICE), vocab).cpu()
    assert bias.shape == (3, vocab)
    assert torch.equal(bias == 0, allowed) and torch.isneginf(bias[~allowed]).all()


def test_only_allowed_tokens_are_sampled_and_other_rows_are_untouched() -> None:
    vocab, g = 300, torch.Generator().manual_seed(1)
    logits = torch.randn(4, vocab, generator=g)
    allowed = torch.zeros(2, vocab, dtype=torch.bool)
    allowed[0, [5, 77, 290]] = True
    allowed[1, [EOS]] = True
    params = [SamplingParams(temperature=1.0, seed=i) for i in range(3)] + [SamplingParams(temperature=0.0)]
    for step in range(20):
        batch = masked_batch(params, vocab, allowed, rows=[1, 3])
        batch.steps.fill_(step)
        out = sampler.sample(logits.to(DEVICE), batch)
        assert int(out.token_ids[1]) in (5, 77, 290) and int(out.token_ids[3]) == EOS
        plain = SamplingBatch.build(params, vocab_size=vocab, device=DEVICE, eos_id=EOS)
        plain.steps.fill_(step)
        ref = sampler.sample(logits.to(DEVICE), plain)
        assert torch.equal(out.token_ids[[0, 2]], ref.token_ids[[0, 2]])  # unconstrained rows: the same draw
    processed = sampler.process_logits(logits.to(DEVICE), masked_batch(params, vocab, allowed, rows=[1, 3])).cpu()
    unmasked = sampler.process_logits(logits.to(DEVICE), SamplingBatch.build(params, vocab_size=vocab, device=DEVICE,
                                                                           eos_id=EOS)).cpu()
    assert torch.equal(processed[[0, 2]], unmasked[[0, 2]])
    assert torch.equal(processed[1, [5, 77, 290]], unmasked[1, [5, 77, 290]])  # allowed values unchanged
    assert torch.isneginf(processed[1]).sum() == vocab - 3


def test_bitmask_rows_in_any_order_and_without_rows() -> None:
    """Nine rows: across the CPU path's chunks of four."""
    vocab, g = 200, torch.Generator().manual_seed(3)
    logits = torch.randn(9, vocab, generator=g)
    allowed = torch.rand(9, vocab, generator=g) < 0.1
    params = [SamplingParams(temperature=1.0, seed=i) for i in range(9)]
    aligned = masked_batch(params, vocab, allowed, rows=list(range(9)))
    aligned.bitmask_rows = None
    expected = torch.where(allowed, sampler.process_logits(logits.to(DEVICE), SamplingBatch.build(
        params, vocab_size=vocab, device=DEVICE, eos_id=EOS)).cpu(), float("-inf"))
    assert torch.equal(sampler.process_logits(logits.to(DEVICE), aligned).cpu(), expected)
    order = [8, 2, 5, 0, 7, 1, 3, 6, 4]
    shuffled = masked_batch(params, vocab, allowed[order], rows=order)
    assert torch.equal(sampler.process_logits(logits.to(DEVICE), shuffled).cpu(), expected)


def test_the_callers_logits_are_not_modified() -> None:
    logits = torch.randn(2, 64, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    before = logits.clone()
    allowed = torch.zeros(1, 64, dtype=torch.bool)
    allowed[0, 3] = True
    sampler.sample(logits, masked_batch([SamplingParams(temperature=1.0, seed=0)] * 2, 64, allowed, rows=[0]))
    assert torch.equal(logits, before)


def test_a_guided_row_is_not_banned_from_ending_by_min_tokens() -> None:
    params = [SamplingParams(min_tokens=5), SamplingParams(min_tokens=5)]
    batch = SamplingBatch.build(params, vocab_size=16, eos_id=EOS, output_ids=[[], []], guided=[True, False])
    assert batch.banned is not None and not batch.banned[0].any() and batch.banned[1, EOS]
