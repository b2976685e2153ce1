"""Metric arithmetic against hand-computed examples."""

import pytest

from v4serve.bench.metrics import (
    RequestRecord,
    best_under_slo,
    compute_point_metrics,
    distribution_ms,
    interactivity,
    percentile,
)


def _rec(phase="measured", ok=True, **kw):
    base = {"lane": 0, "session_id": "s", "conv_id": "c", "turn": 0, "phase": phase, "start_s": 0.0, "ok": ok}
    return RequestRecord(**(base | kw))


def _records():
    return [
        _rec(
            ttft_s=0.1,
            itl_s=[0.01, 0.02, 0.03, 0.04],
            e2el_s=0.2,
            prompt_tokens=1000,
            completion_tokens=5,
            cached_tokens=900,
            expected_output_tokens=5,
            reusable_tokens=950,
        ),
        _rec(
            ttft_s=0.3,
            itl_s=[0.05, 0.06],
            e2el_s=0.5,
            prompt_tokens=3000,
            completion_tokens=3,
            cached_tokens=2000,
            expected_output_tokens=4,
            reusable_tokens=2500,
        ),
        _rec(ok=False, error="HTTP 500: boom"),
        _rec(phase="warmup", ttft_s=9.0, itl_s=[9.0], e2el_s=20.0, prompt_tokens=10**6, completion_tokens=2),
        _rec(phase="prime", ttft_s=1.0, e2el_s=1.0, prompt_tokens=5000, completion_tokens=1),
    ]


def test_point_metrics_hand_computed():
    m = compute_point_metrics(_records(), concurrency=4, num_gpus=2, duration_s=2.0, max_inflight=5)
    # TPGS = (1000 + 3000 input incl. cached + 5 + 3 output) / 2 s / 2 GPUs
    assert m.tpgs == pytest.approx(4008 / 2 / 2)
    assert m.output_tps_per_gpu == pytest.approx(8 / 4)
    assert m.requests_completed == 2 and m.requests_failed == 1
    assert m.error_rate == pytest.approx(1 / 3)
    # Pooled ITLs [10..60 ms]: p50 = 35 ms, p90 = 50 + 0.5 * 10 = 55 ms (linear interpolation).
    assert m.itl_ms["p50"] == pytest.approx(35.0)
    assert m.itl_ms["p90"] == pytest.approx(55.0)
    assert m.interactivity_p50 == pytest.approx(1 / 0.035)
    assert m.interactivity_p90 == pytest.approx(1 / 0.055)
    # TPOT: (0.2 - 0.1) / 4 = 25 ms and (0.5 - 0.3) / 2 = 100 ms.
    assert m.tpot_ms["mean"] == pytest.approx(62.5)
    assert m.interactivity_tpot_p90 == pytest.approx(1 / (0.025 + 0.9 * 0.075))
    assert m.ttft_ms["p50"] == pytest.approx(200.0)
    assert m.e2el_ms["mean"] == pytest.approx(350.0)
    # Hit rates: server 2900 / 4000, theoretical 3450 / 4000.
    assert m.hit_rate == pytest.approx(0.725)
    assert m.theoretical_hit_rate == pytest.approx(0.8625)
    assert m.cached_tokens_reported
    assert m.output_length_mismatches == 1  # 3 tokens where 4 were forced
    assert (m.warmup_requests, m.prime_requests, m.max_inflight) == (1, 1, 5)
    assert m.errors == ["HTTP 500: boom"]


def test_hit_rate_only_over_requests_that_report_cached_tokens():
    recs = [
        _rec(prompt_tokens=100, completion_tokens=1, cached_tokens=50),
        _rec(prompt_tokens=300, completion_tokens=1, cached_tokens=None),
    ]
    m = compute_point_metrics(recs, 1, 1, 1.0)
    assert m.hit_rate == pytest.approx(0.5)
    assert not m.cached_tokens_reported


def test_percentiles_and_empty_inputs():
    assert percentile([1, 2, 3, 4], 50) == pytest.approx(2.5)
    assert percentile([], 90) is None
    assert interactivity([], 90) is None
    assert interactivity([0.02, 0.02], 90) == pytest.approx(50.0)
    assert distribution_ms([]) == {"mean": None, "p50": None, "p90": None, "p99": None}
    m = compute_point_metrics([], 1, 1, 1.0)
    assert m.tpgs == 0 and m.error_rate == 0 and m.interactivity_p90 is None and m.hit_rate is None


def test_best_under_slo():
    points = [
        {
            "concurrency": 1,
            "tpgs": 100.0,
            "interactivity_p90": 200.0,
            "output_tps_per_gpu": 1.0,
            "requests_completed": 9,
        },
        {
            "concurrency": 4,
            "tpgs": 300.0,
            "interactivity_p90": 120.0,
            "output_tps_per_gpu": 2.0,
            "requests_completed": 9,
        },
        {
            "concurrency": 16,
            "tpgs": 500.0,
            "interactivity_p90": 60.0,
            "output_tps_per_gpu": 3.0,
            "requests_completed": 9,
        },
        {
            "concurrency": 64,
            "tpgs": 900.0,
            "interactivity_p90": None,
            "output_tps_per_gpu": 0.0,
            "requests_completed": 0,
        },
    ]
    assert best_under_slo(points, 150)["concurrency"] == 1
    assert best_under_slo(points, 50) == {
        "concurrency": 16,
        "tpgs": 500.0,
        "interactivity_p90": 60.0,
        "output_tps_per_gpu": 3.0,
    }
    assert best_under_slo(points, 250) is None
