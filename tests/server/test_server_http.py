"""The real server over raw HTTP: error bodies, client disconnects, the Anthropic route, /metrics, tokenize."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

LONG = {"max_tokens": 3000, "ignore_eos": True}


@pytest.fixture(scope="module")
def http(tiny_server_url: str):
    with httpx.Client(base_url=tiny_server_url, timeout=60) as c:
        yield c


def metrics(http: httpx.Client) -> dict[tuple[str, tuple], float]:
    text = http.get("/metrics").text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def wait_idle(http: httpx.Client, seconds: float = 20.0) -> dict:
    """Poll /metrics until the engine runs nothing and holds no KV blocks for requests."""
    deadline = time.monotonic() + seconds
    while True:
        m = metrics(http)
        idle = (m[("v4serve_num_requests_running", ())] == 0 and m[("v4serve_num_requests_waiting", ())] == 0
                and m[("v4serve_kv_cache_blocks", (("state", "used"),))] == 0
                and m[("v4serve_requests_in_flight", ())] == 0)
        if idle:
            return m
        assert time.monotonic() < deadline, f"engine still busy: {m}"
        time.sleep(0.2)


def aborted(m: dict, route: str) -> float:
    return m.get(("v4serve_requests_total", (("finish_reason", "abort"), ("route", route))), 0.0)


BAD_SCHEMA_FORMAT = (b'{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", '
                     b'"json_schema": {"schema": {"type": "nope"}}}}')


@pytest.mark.parametrize("body, status, param", [
    (b'{"messages": [{"role": "user", "content": "x"}', 400, None),
    (b'{"messages": "hello"}', 400, "messages"),
    (b'{"messages": [{"role": "user", "content": "x"}], "n": "2"}', 400, "n"),
    (b'{"messages": [{"role": "user", "content": "x"}], "modalities": ["audio"]}', 400, "modalities"),
    (BAD_SCHEMA_FORMAT, 400, "response_format"),
    (b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]}', 400, "model"),
    (b'{"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 4096}', 400,
     "max_completion_tokens"),
    (b'{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {}}]}', 400,
     "tools"),
])
def test_bad_requests(http: httpx.Client, body: bytes, status: int, param: str | None) -> None:
    r = http.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    assert err["param"] == param and len(err["message"]) > 10


def test_prompt_longer_than_the_context(http: httpx.Client) -> None:
    r = http.post("/v1/completions", json={"prompt": "hello " * 4200, "max_tokens": 1})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and "4096" in err["message"] and err["param"] == "prompt"
    wait_idle(http)


def test_streaming_disconnect_aborts_and_frees_blocks(http: httpx.Client) -> None:
    before = aborted(metrics(http), "chat")
    body = {"messages": [{"role": "user", "content": "Tell me everything. " * 20}], "stream": True, **LONG}
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        got = [line for line, _ in zip(lines, range(8)) if line.startswith("data: ")]
        assert len(got) >= 3  # role chunk + tokens: the request is running
        m = metrics(http)
        assert m[("v4serve_num_requests_running", ())] == 1
        assert m[("v4serve_kv_cache_blocks", (("state", "used"),))] > 0
    m = wait_idle(http)  # leaving the block closed the connection mid-stream
    assert aborted(m, "chat") == before + 1


def test_non_streaming_disconnect_aborts(tiny_server_url: str, http: httpx.Client) -> None:
    before = aborted(metrics(http), "completions")
    with httpx.Client(base_url=tiny_server_url, timeout=1.5) as impatient, pytest.raises(httpx.ReadTimeout):
        impatient.post("/v1/completions", json={"prompt": "Go on and on", **LONG})
    m = wait_idle(http)
    assert aborted(m, "completions") == before + 1


def test_anthropic_messages(http: httpx.Client) -> None:
    r = http.post("/v1/messages", json={"model": "tiny-v4-flash", "max_tokens": 5, "system": "Be terse.",
                                        "messages": [{"role": "user", "content": "Hi"}]},
                  headers={"anthropic-version": "2023-06-01"})
    body = r.json()
    assert r.status_code == 200 and body["type"] == "message" and body["role"] == "assistant"
    assert body["stop_reason"] in ("max_tokens", "end_turn") and body["id"].startswith("msg_")
    assert body["usage"]["output_tokens"] <= 5 and body["usage"]["input_tokens"] > 0
    assert all(b["type"] in ("text", "thinking") for b in body["content"])


def test_anthropic_streaming_forced_tool(http: httpx.Client) -> None:
    tools = [{"name": "bash", "description": "Run a command",
              "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}]
    body = {"max_tokens": 6, "stream": True, "tools": tools, "tool_choice": {"type": "tool", "name": "bash"},
            "messages": [{"role": "user", "content": "List files"}]}
    with http.stream("POST", "/v1/messages", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events, name = [], None
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                events.append((name, json.loads(line[6:])))
    names = [n for n, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    starts = [d["content_block"] for n, d in events if n == "content_block_start"]
    assert starts[0]["type"] == "tool_use" and starts[0]["name"] == "bash" and starts[0]["id"].startswith("toolu_")
    args = "".join(d["delta"].get("partial_json", "") for n, d in events if n == "content_block_delta"
                   and d["index"] == 0)
    assert isinstance(json.loads(args or "{}"), dict)
    assert names.count("content_block_start") == names.count("content_block_stop")
    usage = events[-2][1]["usage"]
    assert usage["output_tokens"] <= 6 and usage["cache_read_input_tokens"] >= 0


def test_anthropic_error_shape(http: httpx.Client) -> None:
    r = http.post("/v1/messages", json={"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]})
    assert r.status_code == 400
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"


def test_tokenize_roundtrip(http: httpx.Client) -> None:
    r = http.post("/tokenize", json={"prompt": "def f(x): return x"}).json()
    assert r["count"] == len(r["tokens"]) and r["max_model_len"] == 4096
    assert http.post("/detokenize", json={"tokens": r["tokens"]}).json()["prompt"] == "def f(x): return x"


def test_metrics_parse(http: httpx.Client) -> None:
    http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 2})
    m = metrics(http)
    names = {name for name, _ in m}
    for expected in ("v4serve_time_to_first_token_seconds_count", "v4serve_inter_token_latency_seconds_count",
                     "v4serve_e2e_request_latency_seconds_count", "v4serve_prompt_tokens_total",
                     "v4serve_generation_tokens_total", "v4serve_cached_prompt_tokens_total",
                     "v4serve_prefix_cache_hit_rate", "v4serve_kv_cache_usage_ratio", "v4serve_kv_cache_bytes",
                     "v4serve_num_requests_running", "v4serve_num_requests_waiting", "v4serve_num_preemptions_total",
                     "v4serve_engine_alive"):
        assert expected in names, expected
    assert m[("v4serve_engine_alive", ())] == 1
    assert m[("v4serve_kv_cache_blocks", (("state", "total"),))] > 0
    assert {k[1][0][1] for k in m if k[0] == "v4serve_kv_cache_bytes"} >= {"compressed", "index_keys", "window"}
    assert m[("v4serve_generation_tokens_total", ())] >= 2
    # the engine's step times by kind: the prompt's step and the decode step after it
    assert m[("v4serve_engine_step_seconds_count", (("kind", "prefill"),))] >= 1
    assert m[("v4serve_engine_step_seconds_count", (("kind", "decode"),))] >= 1
    assert m[("v4serve_engine_step_seconds_bucket", (("kind", "decode"), ("le", "+Inf")))] == \
        m[("v4serve_engine_step_seconds_count", (("kind", "decode"),))]
