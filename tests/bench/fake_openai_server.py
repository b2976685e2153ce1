"""A tiny OpenAI-compatible stand-in for developing and unit-testing the benchmark client.

Not a model: it "tokenizes" on whitespace, emulates a prefix cache by longest common prefix with
earlier prompts (in blocks), streams `w0 w1 ...` with a fixed TTFT/ITL, honours `max_tokens`,
`ignore_eos`/`min_tokens` (otherwise it stops after `natural_length` tokens), `cache_salt` and
`stream_options.include_usage`. It binds 127.0.0.1 on a free port and runs in a daemon thread.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Self

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route


@dataclass
class FakeServerConfig:
    model: str = "fake-v4"
    ttft_s: float = 0.004
    itl_s: float = 0.001
    tokens_per_chunk: int = 1
    natural_length: int = 3
    reasoning_tokens: int = 0  # the first N generated tokens stream as reasoning_content
    cache_block: int = 4
    report_cached: bool = True
    fail_every: int = 0  # every n-th generation request answers HTTP 500
    max_model_len: int = 1 << 20
    responder: Callable[[list[dict[str, Any]]], str] | None = None  # canned non-streaming answers
    api_key: str | None = None  # when set, every /v1 route needs `Authorization: Bearer <key>`


@dataclass
class _State:
    prompts: list[tuple[str, ...]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    count: int = 0


class FakeOpenAIServer:
    def __init__(self, config: FakeServerConfig | None = None) -> None:
        self.config = config or FakeServerConfig()
        self.state = _State()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.base_url = ""

    @property
    def requests(self) -> list[dict[str, Any]]:
        return self.state.requests

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> str:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        config = uvicorn.Config(self._app(), log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        if not self._server.started:
            raise RuntimeError("fake server did not start")
        self.base_url = f"http://127.0.0.1:{port}"
        return self.base_url

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)

    # -- the app ---------------------------------------------------------------------------

    def _app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/health", lambda r: PlainTextResponse("ok")),
                Route("/v1/models", self._guard(self._models)),
                Route("/v1/chat/completions", self._guard(self._chat), methods=["POST"]),
                Route("/v1/completions", self._guard(self._completions), methods=["POST"]),
            ]
        )

    def _guard(self, handler: Callable[[Request], Any]) -> Callable[[Request], Any]:
        async def checked(request: Request) -> Response:
            key = self.config.api_key
            if key and request.headers.get("authorization") != f"Bearer {key}":
                return JSONResponse({"error": {"message": "missing or wrong API key"}}, status_code=401)
            return await handler(request)

        return checked

    async def _models(self, request: Request) -> Response:
        cfg = self.config
        card = {"id": cfg.model, "object": "model", "owned_by": "fake", "max_model_len": cfg.max_model_len}
        return JSONResponse({"object": "list", "data": [card]})

    async def _chat(self, request: Request) -> Response:
        body = await request.json()
        tokens = [
            t for m in body["messages"] for t in (f"<{m['role']}>", *str(m.get("content") or "").split())
        ]
        return await self._generate(body, tokens, chat=True)

    async def _completions(self, request: Request) -> Response:
        body = await request.json()
        return await self._generate(body, str(body["prompt"]).split(), chat=False)

    async def _generate(self, body: dict[str, Any], tokens: list[str], chat: bool) -> Response:
        cfg, state = self.config, self.state
        state.requests.append(body)
        state.count += 1
        if cfg.fail_every and state.count % cfg.fail_every == 0:
            return JSONResponse({"error": {"message": "injected failure"}}, status_code=500)
        key = (f"salt:{body['cache_salt']}",) if body.get("cache_salt") else ()
        prompt = key + tuple(tokens)
        cached = self._lookup(prompt)
        state.prompts.append(prompt)
        del state.prompts[:-256]
        max_tokens = int(body.get("max_tokens") or 16)
        forced = body.get("ignore_eos") or body.get("min_tokens")
        n_out = (
            max_tokens
            if forced
            else min(max_tokens, max(cfg.natural_length, int(body.get("min_tokens") or 0)))
        )
        usage = {
            "prompt_tokens": len(tokens),
            "completion_tokens": n_out,
            "total_tokens": len(tokens) + n_out,
        }
        if cfg.report_cached:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        if not body.get("stream"):
            text = (
                cfg.responder(body.get("messages", []))
                if cfg.responder
                else " ".join(f"w{i}" for i in range(n_out))
            )
            await asyncio.sleep(cfg.ttft_s)
            message = {"role": "assistant", "content": text}
            choice = (
                {"index": 0, "message": message, "finish_reason": "stop"}
                if chat
                else {"index": 0, "text": text, "finish_reason": "stop"}
            )
            return JSONResponse(
                {"id": "fake", "object": "chat.completion", "choices": [choice], "usage": usage}
            )
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return StreamingResponse(
            self._stream(n_out, usage, include_usage, chat), media_type="text/event-stream"
        )

    def _lookup(self, prompt: tuple[str, ...]) -> int:
        best = 0
        for old in self.state.prompts:
            n = 0
            for a, b in zip(old, prompt, strict=False):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        best = min(best, len(prompt) - 1)  # the last token is always computed
        return max(0, best - best % self.config.cache_block)

    async def _stream(
        self, n_out: int, usage: dict[str, Any], include_usage: bool, chat: bool
    ) -> AsyncIterator[str]:
        cfg = self.config

        def event(payload: dict[str, Any]) -> str:
            return f"data: {json.dumps(payload)}\n\n"

        if chat:  # a role-only chunk first: it must not count as the first token
            yield event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        await asyncio.sleep(cfg.ttft_s)
        i = 0
        while i < n_out:
            if i:
                await asyncio.sleep(cfg.itl_s)
            step = min(cfg.tokens_per_chunk, n_out - i)
            words = "".join(f" w{j}" for j in range(i, i + step))
            field_name = "reasoning_content" if i < cfg.reasoning_tokens else "content"
            last = i + step >= n_out
            if chat:
                choice = {
                    "index": 0,
                    "delta": {field_name: words},
                    "finish_reason": "length" if last else None,
                }
            else:
                choice = {"index": 0, "text": words, "finish_reason": "length" if last else None}
            yield event({"choices": [choice]})
            i += step
        if include_usage:
            yield event({"choices": [], "usage": usage})
        yield "data: [DONE]\n\n"
