"""Fidelity statistics between a reference model and ours: next-token KL, top-1 agreement, and the
share of identical greedy continuations.

Dense inputs are logits or log-probabilities of shape [..., vocab] (numpy arrays, or anything
`np.asarray` takes, e.g. CPU torch tensors); the last axis is normalised with a log-softmax, so
either form works. KL is KL(P || Q) in nats with P the reference. Sparse inputs are top-k
log-probabilities per position (what an OpenAI `logprobs` response gives); see `kl_top_k`.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

_EPS = 1e-12


def log_softmax(x: Any, axis: int = -1) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    shifted = arr - arr.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


def kl_divergence(p_logits: Any, q_logits: Any) -> np.ndarray:
    """Per-position KL(P || Q) over the last axis; inputs are logits or log-probabilities."""
    log_p, log_q = log_softmax(p_logits), log_softmax(q_logits)
    if log_p.shape != log_q.shape:
        raise ValueError(f"shape mismatch: {log_p.shape} vs {log_q.shape}")
    p = np.exp(log_p)
    # Where p is 0 the term is 0 even if q is 0 too (0 * -inf would be nan); where only q is 0
    # the KL is +inf, as it should be.
    with np.errstate(invalid="ignore"):
        terms = np.where(p > 0, p * (log_p - log_q), 0.0)
    return np.maximum(terms.sum(axis=-1), 0.0)


def top1_agreement(p_logits: Any, q_logits: Any) -> float:
    """Share of positions where both distributions have the same argmax token."""
    a, b = np.asarray(p_logits).argmax(axis=-1), np.asarray(q_logits).argmax(axis=-1)
    return float(np.mean(a == b)) if a.size else 1.0


def kl_top_k(p_top: Mapping[Hashable, float], q_top: Mapping[Hashable, float]) -> float:
    """Approximate KL(P || Q) from top-k log-probabilities of one position.

    Buckets: each token in P's top-k, plus one "rest" bucket holding P's remaining mass. A P token
    missing from Q's top-k gets an equal share of Q's unreported mass, but no more than Q's
    smallest reported probability (it ranked below all of them). When Q reports every token of
    P's top-k, merging the rest into one bucket can only lower KL (data-processing inequality),
    so the value is a lower bound; with k = vocabulary it is exact.
    """
    p = {t: math.exp(v) for t, v in p_top.items()}
    q = {t: math.exp(v) for t, v in q_top.items()}
    q_rest_mass = max(0.0, 1.0 - sum(q.values()))
    missing = [t for t in p if t not in q]
    q_floor = min(q.values()) if q else 1.0
    q_missing = min(q_floor, q_rest_mass / len(missing)) if missing else 0.0
    kl = 0.0
    q_used = 0.0
    for token, pv in p.items():
        qv = q.get(token, q_missing)
        q_used += qv
        if pv > 0:
            kl += pv * (math.log(pv) - math.log(max(qv, _EPS)))
    p_rest = max(0.0, 1.0 - sum(p.values()))
    q_rest = max(_EPS, 1.0 - q_used)
    if p_rest > 1e-9:
        kl += p_rest * (math.log(p_rest) - math.log(q_rest))
    return max(0.0, kl)


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def greedy_match(reference: Sequence[Sequence[int]], candidate: Sequence[Sequence[int]]) -> dict[str, float]:
    """Share of identical greedy continuations and mean agreeing prefix (share of reference length)."""
    if len(reference) != len(candidate):
        raise ValueError("need one candidate continuation per reference continuation")
    if not reference:
        return {"identical_share": 1.0, "mean_prefix_share": 1.0}
    identical = sum(list(r) == list(c) for r, c in zip(reference, candidate, strict=True))
    prefix = [common_prefix_length(r, c) / max(1, len(r)) for r, c in zip(reference, candidate, strict=True)]
    return {"identical_share": identical / len(reference), "mean_prefix_share": float(np.mean(prefix))}


@dataclass(frozen=True, slots=True)
class DivergenceSummary:
    positions: int
    kl_mean: float
    kl_median: float
    kl_p99: float
    kl_max: float
    top1_agreement: float
    greedy_identical_share: float | None = None
    greedy_mean_prefix_share: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(
    p_logits: Any,
    q_logits: Any,
    reference_tokens: Sequence[Sequence[int]] | None = None,
    candidate_tokens: Sequence[Sequence[int]] | None = None,
) -> DivergenceSummary:
    """All fidelity statistics of dense next-token distributions (+ greedy continuations if given)."""
    vocab = np.asarray(p_logits).shape[-1]
    kl = kl_divergence(p_logits, q_logits).reshape(-1)
    agree = top1_agreement(np.asarray(p_logits).reshape(-1, vocab), np.asarray(q_logits).reshape(-1, vocab))
    greedy = (
        greedy_match(reference_tokens, candidate_tokens)
        if reference_tokens is not None and candidate_tokens is not None
        else None
    )
    return DivergenceSummary(
        positions=int(kl.size),
        kl_mean=float(kl.mean()) if kl.size else 0.0,
        kl_median=float(np.median(kl)) if kl.size else 0.0,
        kl_p99=float(np.percentile(kl, 99)) if kl.size else 0.0,
        kl_max=float(kl.max()) if kl.size else 0.0,
        top1_agreement=agree,
        greedy_identical_share=greedy["identical_share"] if greedy else None,
        greedy_mean_prefix_share=greedy["mean_prefix_share"] if greedy else None,
    )
