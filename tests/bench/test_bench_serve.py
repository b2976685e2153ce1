"""The classic serving benchmark: vLLM-named metrics by hand, and a run against the stand-in."""

import asyncio
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the stand-in server next to this file
from fake_openai_server import FakeOpenAIServer, FakeServerConfig

from v4serve.bench.client import StreamResult
from v4serve.bench.serve_bench import (
    ServeBenchConfig,
    format_summary,
    parse_goodput,
    run_serve_bench,
    sample_requests,
    serve_metrics,
)
from v4serve.bench.text import default_text


def test_serve_metrics_hand_computed():
    results = [
        StreamResult(
            ok=True, ttft_s=0.1, itl_s=[0.01, 0.01, 0.02], e2el_s=0.14, prompt_tokens=100, completion_tokens=4
        ),
        StreamResult(ok=True, ttft_s=0.3, itl_s=[0.05], e2el_s=0.35, prompt_tokens=200, completion_tokens=2),
        StreamResult(ok=False, error="HTTP 503: busy"),
    ]
    cfg = ServeBenchConfig(base_url="x", num_gpus=2, goodput={"ttft": 200.0}, percentiles=(50.0, 99.0))
    m = serve_metrics(results, 1.0, cfg)
    assert (m["completed"], m["failed"], m["total_input_tokens"], m["total_output_tokens"]) == (2, 1, 300, 6)
    assert m["request_throughput"] == pytest.approx(2.0)
    assert m["request_goodput"] == pytest.approx(1.0)  # only the first meets TTFT <= 200 ms
    assert m["output_throughput"] == pytest.approx(6.0)
    assert m["total_token_throughput"] == pytest.approx(306.0)
    assert m["total_token_throughput_per_gpu"] == pytest.approx(153.0)
    assert m["mean_ttft_ms"] == pytest.approx(200.0) and m["median_ttft_ms"] == pytest.approx(200.0)
    assert m["p99_ttft_ms"] == pytest.approx(100 + 0.99 * 200)
    assert m["mean_tpot_ms"] == pytest.approx(((0.04 / 3) + 0.05) / 2 * 1000)
    assert m["mean_itl_ms"] == pytest.approx(22.5) and m["median_itl_ms"] == pytest.approx(15.0)
    assert m["mean_e2el_ms"] == pytest.approx(245.0)
    assert m["errors"] == ["HTTP 503: busy"]


def test_goodput_parsing():
    assert parse_goodput(["ttft:500", "tpot:50"]) == {"ttft": 500.0, "tpot": 50.0}
    assert parse_goodput(None) == {}
    with pytest.raises(ValueError):
        parse_goodput(["speed:3"])


def test_random_prompts_have_the_requested_lengths():
    text = default_text()
    cfg = ServeBenchConfig(base_url="x", input_len=400, output_len=20, num_prompts=6, range_ratio=0.5, seed=1)
    reqs = sample_requests(cfg, text)
    assert all(200 <= r.input_len <= 600 and 10 <= r.output_len <= 30 for r in reqs)
    assert all(abs(text.count(r.prompt) - r.input_len) <= max(2, 0.03 * r.input_len) for r in reqs)
    assert len({r.prompt[:40] for r in reqs}) == 6  # no shared prefixes


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_run_against_stand_in(endpoint):
    with FakeOpenAIServer(FakeServerConfig(ttft_s=0.002, itl_s=0.001)) as server:
        cfg = ServeBenchConfig(
            base_url=server.base_url,
            endpoint=endpoint,
            input_len=64,
            output_len=8,
            num_prompts=12,
            max_concurrency=4,
            request_rate=200.0,
            num_warmups=1,
            goodput={"ttft": 10_000},
            progress=False,
        )
        result = asyncio.run(run_serve_bench(cfg))
        sent = server.requests
    assert result["completed"] == 12 and result["failed"] == 0
    assert result["total_output_tokens"] == 12 * 8
    assert result["max_concurrent_requests"] <= 4
    assert result["request_goodput"] == pytest.approx(result["request_throughput"])
    assert len(sent) == 13 and all(b["ignore_eos"] and b["stream"] for b in sent)
    assert "Serving Benchmark Result" in format_summary(result)
