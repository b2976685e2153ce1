"""Streaming OpenAI-compatible client that times each request (TTFT, ITL, E2EL).

Timing rules (the same as `vllm bench serve`):
* TTFT runs from just before the request is sent to the first chunk that carries generated text
  (`content`, `reasoning_content`/`reasoning`, or `text` for completions). Role-only and empty
  chunks do not count.
* Each later token-bearing chunk adds one ITL sample: the gap since the previous one. A chunk
  that carries several tokens (speculative decoding, server-side batching of the stream) still
  gives a single gap; token-normalised speed is available as TPOT from the request's totals.
* Token counts come from the server's `usage` (`stream_options.include_usage`), never from
  counting chunks; a stream without usage counts as a failed request.
  `prompt_tokens_details.cached_tokens` is the server's prefix-cache hit.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass(slots=True)
class StreamResult:
    ok: bool = False
    error: str | None = None
    text: str = ""  # generated content (what the next turn sends back as the assistant message)
    reasoning: str = ""
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    e2el_s: float = 0.0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reason: str | None = None
    num_chunks: int = 0  # token-bearing chunks

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first (vLLM's TPOT)."""
        if self.ttft_s is None or not self.completion_tokens or self.completion_tokens < 2:
            return None
        return (self.e2el_s - self.ttft_s) / (self.completion_tokens - 1)


def normalize_base_url(base_url: str) -> str:
    """Accept `http://host:port` or `http://host:port/v1`; return the form without `/v1`."""
    url = base_url.rstrip("/")
    return url.removesuffix("/v1")


def auth_headers(api_key: str | None) -> dict[str, str]:
    """`Authorization: Bearer KEY` for servers started with --api-key (v4serve, vLLM, OpenAI)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def make_http_client(request_timeout_s: float, api_key: str | None = None) -> httpx.AsyncClient:
    # No pool limit: subagent fan-out can put more requests in flight than the concurrency.
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    timeout = httpx.Timeout(request_timeout_s, connect=30.0)
    return httpx.AsyncClient(limits=limits, timeout=timeout, headers=auth_headers(api_key))


async def fetch_models(client: httpx.AsyncClient, base_url: str) -> dict[str, Any]:
    response = await client.get(f"{normalize_base_url(base_url)}/v1/models")
    response.raise_for_status()
    return response.json()


def first_model(models: dict[str, Any]) -> str:
    data = models.get("data") or []
    if not data:
        raise RuntimeError("server /v1/models lists no model; pass --model")
    return str(data[0]["id"])


def chat_payload(
    model: str,
    messages: list[dict[str, str]],
    max_tokens: int,
    *,
    force_length: bool = True,
    extra_body: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A streaming chat request; `force_length` pins the completion to exactly max_tokens."""
    return _streaming_payload({"model": model, "messages": messages}, max_tokens, force_length, extra_body)


def completion_payload(
    model: str,
    prompt: str,
    max_tokens: int,
    *,
    force_length: bool = True,
    extra_body: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return _streaming_payload({"model": model, "prompt": prompt}, max_tokens, force_length, extra_body)


def _streaming_payload(base: dict[str, Any], max_tokens: int, force_length: bool,
                       extra_body: dict[str, Any] | None) -> dict[str, Any]:
    payload = base | {"max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True},
                      "temperature": 0.0}
    if force_length:
        payload |= {"ignore_eos": True, "min_tokens": max_tokens}
    return payload | (extra_body or {})


async def stream_request(client: httpx.AsyncClient, url: str, payload: dict[str, Any]) -> StreamResult:
    """POST a streaming request and time it; never raises for server or transport errors."""
    result = StreamResult()
    start = time.perf_counter()
    last: float | None = None
    try:
        async with client.stream("POST", url, json=payload) as response:
            if response.status_code != 200:
                body = (await response.aread()).decode(errors="replace")
                result.error = f"HTTP {response.status_code}: {body[:500]}"
                return result
            async for line in response.aiter_lines():
                event = parse_sse_line(line)
                if event is None:
                    continue
                if event == "[DONE]":
                    break
                now = time.perf_counter()
                if "error" in event:
                    result.error = f"stream error: {json.dumps(event['error'])[:500]}"
                    return result
                if apply_chunk(result, event):
                    if last is None:
                        result.ttft_s = now - start
                    else:
                        result.itl_s.append(now - last)
                    last = now
        result.e2el_s = time.perf_counter() - start
        if result.completion_tokens is None:  # all counts must be the server's
            result.error = "the stream carried no usage (stream_options.include_usage)"
        else:
            result.ok = True
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"[:500]
    finally:
        if not result.e2el_s:
            result.e2el_s = time.perf_counter() - start
    return result


def parse_sse_line(line: str) -> dict[str, Any] | str | None:
    """The JSON payload of an SSE `data:` line, "[DONE]", or None for other lines."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if not data:
        return None
    if data == "[DONE]":
        return data
    return json.loads(data)


def apply_chunk(result: StreamResult, chunk: dict[str, Any]) -> bool:
    """Fold one chunk into `result`; True when it carried generated text."""
    usage = chunk.get("usage")
    if usage:
        result.prompt_tokens = usage.get("prompt_tokens", result.prompt_tokens)
        result.completion_tokens = usage.get("completion_tokens", result.completion_tokens)
        details = usage.get("prompt_tokens_details") or {}
        if details.get("cached_tokens") is not None:
            result.cached_tokens = int(details["cached_tokens"])
    carried = False
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        content = delta.get("content") or choice.get("text") or ""
        reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
        if content:
            result.text += content
        if reasoning:
            result.reasoning += reasoning
        carried = carried or bool(content or reasoning)
        if choice.get("finish_reason"):
            result.finish_reason = choice["finish_reason"]
    if carried:
        result.num_chunks += 1
    return carried
