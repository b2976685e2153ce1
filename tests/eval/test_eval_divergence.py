"""Fidelity statistics: KL divergence, top-1 agreement, greedy continuation agreement."""

import math

import numpy as np
import pytest

from v4serve.eval.divergence import (
    greedy_match,
    kl_divergence,
    kl_top_k,
    log_softmax,
    summarize,
    top1_agreement,
)


def test_kl_hand_computed_two_tokens():
    p, q = np.log([0.5, 0.5]), np.log([0.9, 0.1])
    expected = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)
    assert kl_divergence(p, q) == pytest.approx(expected)
    assert kl_divergence(p + 3.0, q - 7.0) == pytest.approx(expected)  # logits: shift invariant


def test_kl_zero_for_identical_and_handles_zero_probabilities():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(4, 32))
    assert np.allclose(kl_divergence(logits, logits), 0.0)
    p = np.array([0.0, -np.inf, 0.0])  # token 1 has probability 0 under P
    q = np.array([0.0, 0.0, 0.0])
    assert kl_divergence(p, q) == pytest.approx(math.log(1.5))
    assert np.isinf(kl_divergence(q, p))  # Q gives 0 to a token that P does not
    with pytest.raises(ValueError):
        kl_divergence(np.zeros(3), np.zeros(4))


def test_top_k_kl_is_exact_at_full_vocab_and_a_lower_bound_below():
    rng = np.random.default_rng(1)
    lp, lq = log_softmax(rng.normal(size=16)), log_softmax(rng.normal(size=16))
    dense = float(kl_divergence(lp, lq))
    assert kl_top_k(dict(enumerate(lp)), dict(enumerate(lq))) == pytest.approx(dense)
    top = np.argsort(lp)[-5:]
    partial = kl_top_k({int(t): lp[t] for t in top}, dict(enumerate(lq)))
    assert 0 <= partial <= dense + 1e-12
    # A P token missing from Q's top-k gets at most Q's smallest reported probability.
    assert kl_top_k(
        {0: math.log(0.6), 1: math.log(0.4)}, {1: math.log(0.7), 2: math.log(0.2)}
    ) == pytest.approx(0.6 * math.log(0.6 / 0.1) + 0.4 * math.log(0.4 / 0.7))


def test_top1_agreement_and_greedy_match():
    p = np.array([[3.0, 1.0, 0.0], [0.0, 2.0, 1.0], [1.0, 0.0, 5.0]])
    q = np.array([[2.0, 1.0, 0.0], [0.0, 1.0, 2.0], [0.0, 0.0, 9.0]])
    assert top1_agreement(p, q) == pytest.approx(2 / 3)
    match = greedy_match([[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 6]])
    assert match == {"identical_share": 0.5, "mean_prefix_share": pytest.approx(0.75)}
    with pytest.raises(ValueError):
        greedy_match([[1]], [])


def test_summarize_batched_positions():
    rng = np.random.default_rng(2)
    p = rng.normal(size=(2, 3, 10))
    s = summarize(p, p + rng.normal(scale=0.01, size=p.shape), [[1, 2]], [[1, 2]])
    assert s.positions == 6 and 0 <= s.kl_mean < 1e-3 and s.top1_agreement >= 5 / 6
    assert s.greedy_identical_share == 1.0 and s.to_dict()["kl_max"] >= s.kl_median
    assert summarize(p, p).greedy_identical_share is None
