"""Per-request records and the AgentX metrics of one concurrency point.

* TPGS (total tokens per GPU-second) = (server prompt tokens, cached included, + completion
  tokens) of the measured requests / measured wall time / GPUs.
* Interactivity at percentile p = 1 / (p-th percentile of ITL), with all ITL samples of all
  measured requests pooled. p90 interactivity is therefore a slow-tail number (1 / p90 ITL).
* Hit rate = server-reported cached tokens / prompt tokens; the theoretical hit rate counts the
  previous prompt of the same chain (or the parent's, for an inheriting subagent) as reusable.
Percentiles interpolate linearly between samples (numpy's default, as vllm bench serve).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

PERCENTILES = (50, 90, 99)


@dataclass(slots=True)
class RequestRecord:
    lane: int
    session_id: str
    conv_id: str
    turn: int
    phase: str  # "prime" | "warmup" | "measured"
    start_s: float  # seconds since the point started
    ok: bool
    error: str | None = None
    ttft_s: float | None = None
    e2el_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int | None = None
    expected_output_tokens: int = 0
    reusable_tokens: int = 0  # theoretical prefix-cache hit for this request

    @property
    def end_s(self) -> float:
        return self.start_s + self.e2el_s

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.completion_tokens < 2:
            return None
        return (self.e2el_s - self.ttft_s) / (self.completion_tokens - 1)


def percentile(values: Sequence[float] | np.ndarray, q: float) -> float | None:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if len(values) else None


def distribution_ms(values_s: Sequence[float]) -> dict[str, float | None]:
    """mean/p50/p90/p99 in milliseconds of a list of seconds."""
    arr = np.asarray(values_s, dtype=float) * 1000.0
    out: dict[str, float | None] = {"mean": float(arr.mean()) if arr.size else None}
    for q in PERCENTILES:
        out[f"p{q}"] = percentile(arr, q)
    return out


def interactivity(itl_s: Sequence[float], q: float) -> float | None:
    """Tokens per second per user at ITL percentile q: 1 / ITL_q."""
    value = percentile(itl_s, q)
    return None if value is None or value <= 0 else 1.0 / value


@dataclass(slots=True)
class PointMetrics:
    concurrency: int
    num_gpus: int
    duration_s: float
    requests_completed: int
    requests_failed: int
    error_rate: float
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    tpgs: float  # (input incl. cached + output) tokens / s / GPU
    output_tps_per_gpu: float
    request_throughput: float
    interactivity_p50: float | None
    interactivity_p90: float | None
    interactivity_tpot_p90: float | None  # 1 / p90 TPOT: token-normalised variant
    ttft_ms: dict[str, float | None]
    tpot_ms: dict[str, float | None]
    itl_ms: dict[str, float | None]
    e2el_ms: dict[str, float | None]
    hit_rate: float | None  # server cached / prompt tokens
    theoretical_hit_rate: float | None
    cached_tokens_reported: bool
    output_length_mismatches: int  # completions whose length differs from the forced length
    warmup_requests: int = 0
    prime_requests: int = 0
    max_inflight: int = 0
    errors: list[str] = field(default_factory=list)  # a few distinct messages

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def compute_point_metrics(
    records: Iterable[RequestRecord],
    concurrency: int,
    num_gpus: int,
    duration_s: float,
    max_inflight: int = 0,
) -> PointMetrics:
    """Metrics over the measured requests of one concurrency point.

    `duration_s` is the measured wall time: from the start of the window to the later of its end
    and the completion of the last request that started inside it.
    """
    records = list(records)
    measured = [r for r in records if r.phase == "measured"]
    ok = [r for r in measured if r.ok]
    failed = len(measured) - len(ok)
    input_tokens = sum(r.prompt_tokens for r in ok)
    output_tokens = sum(r.completion_tokens for r in ok)
    reported = [r for r in ok if r.cached_tokens is not None]
    cached = sum(r.cached_tokens or 0 for r in reported)
    itls = [gap for r in ok for gap in r.itl_s]
    tpots = [t for r in ok if (t := r.tpot_s) is not None]
    wall = max(duration_s, 1e-9)
    gpus = max(1, num_gpus)
    reported_inputs = sum(r.prompt_tokens for r in reported)
    return PointMetrics(
        concurrency=concurrency,
        num_gpus=gpus,
        duration_s=duration_s,
        requests_completed=len(ok),
        requests_failed=failed,
        error_rate=failed / len(measured) if measured else 0.0,
        input_tokens=input_tokens,
        cached_tokens=cached,
        output_tokens=output_tokens,
        tpgs=(input_tokens + output_tokens) / wall / gpus,
        output_tps_per_gpu=output_tokens / wall / gpus,
        request_throughput=len(ok) / wall,
        interactivity_p50=interactivity(itls, 50),
        interactivity_p90=interactivity(itls, 90),
        interactivity_tpot_p90=(1.0 / p) if (p := percentile(tpots, 90)) else None,
        ttft_ms=distribution_ms([r.ttft_s for r in ok if r.ttft_s is not None]),
        tpot_ms=distribution_ms(tpots),
        itl_ms=distribution_ms(itls),
        e2el_ms=distribution_ms([r.e2el_s for r in ok]),
        hit_rate=cached / reported_inputs if reported_inputs else None,
        theoretical_hit_rate=sum(r.reusable_tokens for r in ok) / input_tokens if input_tokens else None,
        cached_tokens_reported=bool(ok) and len(reported) == len(ok),
        output_length_mismatches=sum(r.completion_tokens != r.expected_output_tokens for r in ok),
        warmup_requests=sum(r.phase == "warmup" for r in records),
        prime_requests=sum(r.phase == "prime" for r in records),
        max_inflight=max_inflight,
        errors=sorted({r.error for r in measured if r.error})[:5],
    )


def best_under_slo(
    points: Sequence[PointMetrics | dict[str, Any]], min_interactivity: float
) -> dict[str, Any] | None:
    """The point with the highest TPGS whose p90 interactivity is at least `min_interactivity`."""
    best: dict[str, Any] | None = None
    for point in points:
        p = point if isinstance(point, dict) else point.to_dict()
        inter = p.get("interactivity_p90")
        if inter is None or inter < min_interactivity or p.get("requests_completed", 0) == 0:
            continue
        if best is None or p["tpgs"] > best["tpgs"]:
            best = p
    if best is None:
        return None
    return {key: best[key] for key in ("concurrency", "tpgs", "interactivity_p90", "output_tps_per_gpu")}
