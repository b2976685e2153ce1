"""End to end: `bench agentic` and `bench serve` against the real v4serve server.

Needs the `tiny_server_url` fixture (tests/conftest.py, provided with the server): the base URL
(`http://127.0.0.1:PORT`, no `/v1`) of a running tiny-model server that streams chat and
completions with `stream_options.include_usage`, honours `ignore_eos`/`min_tokens`, and reports
`usage.prompt_tokens_details.cached_tokens` from a prefix cache. Skipped until it exists.
"""

import argparse
import json

import httpx
import pytest

from v4serve.bench.cli import register_bench


@pytest.fixture
def server_url(request: pytest.FixtureRequest) -> str:
    try:
        return request.getfixturevalue("tiny_server_url")
    except pytest.FixtureLookupError:
        pytest.skip("the tiny_server_url fixture is not provided yet (tests/conftest.py)")


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="v4serve")
    register_bench(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


def _max_context(url: str) -> int:
    card = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]
    return min(1024, int(card.get("max_model_len") or 1024) - 16)


def test_bench_agentic_e2e(server_url, tmp_path):
    rc = _run(
        [
            "bench",
            "agentic",
            "--base-url",
            server_url,
            "--concurrency",
            "1,2",
            "--duration",
            "2",
            "--out",
            str(tmp_path),
            "--scale",
            "0.002",
            "--output-scale",
            "0.01",
            "--max-context",
            str(_max_context(server_url)),
            "--warmup-requests",
            "1",
            "--think-time-scale",
            "0",
            "--request-timeout",
            "120",
            "--drain-timeout",
            "120",
            "--no-progress",
        ]
    )
    assert rc == 0
    (result,) = tmp_path.glob("agentic-*.json")
    doc = json.loads(result.read_text())
    assert doc["server_models"]["data"] and [p["concurrency"] for p in doc["points"]] == [1, 2]
    for point in doc["points"]:
        assert point["requests_completed"] >= 1, point["errors"]
        assert point["error_rate"] == 0, point["errors"]
        assert point["output_length_mismatches"] == 0  # ignore_eos + min_tokens force the length
        assert point["cached_tokens_reported"]  # usage.prompt_tokens_details.cached_tokens
        assert point["tpgs"] > 0 and point["input_tokens"] > point["output_tokens"]
    assert sum(p["cached_tokens"] for p in doc["points"]) > 0  # multi-turn prefixes hit the cache
    assert list(tmp_path.glob("agentic-*.md")) and list(tmp_path.glob("agentic-*.png"))


def test_bench_serve_e2e(server_url, tmp_path):
    rc = _run(
        [
            "bench",
            "serve",
            "--base-url",
            server_url,
            "--input-len",
            "32",
            "--output-len",
            "4",
            "--num-prompts",
            "4",
            "--max-concurrency",
            "2",
            "--out",
            str(tmp_path),
            "--request-timeout",
            "120",
            "--no-progress",
        ]
    )
    assert rc == 0
    (result,) = tmp_path.glob("serve-*.json")
    res = json.loads(result.read_text())
    assert (res["completed"], res["failed"], res["total_output_tokens"]) == (4, 0, 16)
    assert res["total_input_tokens"] >= 4 * 16 and res["mean_ttft_ms"] > 0 and res["mean_itl_ms"] > 0
