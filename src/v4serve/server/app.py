"""The FastAPI app: `create_app(client, tokenizer, ready, args)`.

Routes: /v1/chat/completions (openai_chat), /v1/completions (openai_completions), /v1/responses (responses),
/v1/messages and /v1/messages/count_tokens (anthropic), and here /v1/models, /health, /metrics, /tokenize, /detokenize,
/version. One pure-ASGI guard in front of everything checks the API key (every route but /health) and
refuses bodies over --max-request-bytes with 413 before anything parses them.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from argparse import Namespace
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import __version__ as VERSION
from ..engine.core import AsyncEngineClient
from ..engine.protocol import Ready
from ..tokenizer import Tokenizer
from . import anthropic, openai_chat, openai_completions, responses
from .args import DEFAULT_MAX_REQUEST_BYTES
from .chat import ChatFormatError, encode_chat, tools_for_prompt
from .errors import APIError, error_response, install_error_handlers
from .logprobs import TokenText
from .metrics import ServerMetrics
from .protocol import DetokenizeRequest, TokenizeRequest, parse_body
from .streaming import Admission

log = logging.getLogger("v4serve.server")
OPEN_PATHS = ("/health",)


class ServerState:
    """What every route needs: the engine client, the tokenizer, the engine's facts, options, metrics."""

    def __init__(self, client: AsyncEngineClient, tokenizer: Tokenizer, ready: Ready, args: Namespace) -> None:
        self.client, self.tokenizer, self.ready, self.args = client, tokenizer, ready, args
        names = getattr(args, "served_model_name", None) or [getattr(args, "model", None) or ready.model]
        self.served_names: list[str] = list(names)
        self.args.default_thinking = getattr(args, "default_thinking", "auto")
        self.metrics = ServerMetrics(self.served_names[0])
        client.on_step = self.metrics.vllm.iteration_tokens.observe
        limit = getattr(args, "max_num_seqs", 64) + getattr(args, "max_queue_len", 1024)
        self.admission = Admission(limit, getattr(args, "retry_after", 1), self.metrics)
        self.token_text = TokenText(tokenizer)
        # message content is untrusted text: its control-token strings tokenize as plain text unless the operator
        # restores the old behaviour (--control-tokens-in-content)
        self.plain_content = None if getattr(args, "control_tokens_in_content", False) else tokenizer.mark_plain
        self.started = time.time()

    def check_model(self, name: str | None) -> str:
        """The model name to report; an unknown one is a 400 listing the served names."""
        if name is None or name in self.served_names:
            return name or self.served_names[0]
        raise APIError(f"model {name!r} is not served here; this server serves {', '.join(self.served_names)} "
                       "(GET /v1/models)", param="model", code="model_not_found")


class Guard:
    """API key and body-size checks before any route runs (pure ASGI: streaming responses pass untouched)."""

    def __init__(self, app: ASGIApp, api_key: str | list[str] | None, max_bytes: int, metrics: ServerMetrics,
                 log_requests: bool = False) -> None:
        keys = [api_key] if isinstance(api_key, str) else list(api_key or [])
        self.api_keys = [k for k in keys if k]
        self.app, self.max_bytes, self.metrics, self.log_requests = app, max_bytes, metrics, log_requests

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, err: APIError) -> None:
        self.metrics.count_error(scope["path"], err.status)
        log.info("refused %s %s: %d %s", scope.get("method", ""), scope["path"], err.status, err.message)
        await error_response(scope["path"], err)(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if self.log_requests:
            client = scope.get("client") or ("?", 0)
            log.info("request %s %s from %s", scope.get("method", ""), path, client[0])
        if self.api_keys and path not in OPEN_PATHS and not self._authorized(headers):
            err = APIError("missing or wrong API key: send `Authorization: Bearer <key>` (or `x-api-key: <key>`)",
                           401, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
            return await self._refuse(scope, receive, send, err)
        too_big = APIError(f"the request body is larger than this server accepts ({self.max_bytes} bytes, "
                           "--max-request-bytes)", 413, code="request_too_large")
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await self._refuse(scope, receive, send, too_big)
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        chunks, size = [], 0
        while True:  # read the whole body now, within the limit; the app then reads it from memory
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                return await self._refuse(scope, receive, send, too_big)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    def _authorized(self, headers: dict[str, str]) -> bool:
        auth = headers.get("authorization", "")
        token = auth[7:].strip() if auth[:7].lower() == "bearer " else headers.get("x-api-key", "")
        # every key is compared (no early exit): the time taken does not say which key came close
        return sum(hmac.compare_digest(token.encode(), k.encode()) for k in self.api_keys) > 0


def _route_patterns(routes: list[Any]) -> list[tuple[Any, str]]:
    """(regex, template) of every route, through included routers (FastAPI wraps them)."""
    out = []
    for r in routes:
        if hasattr(r, "path_regex"):
            out.append((r.path_regex, r.path))
        inner = getattr(r, "original_router", None) or getattr(r, "routes", None)
        if inner is not None and not hasattr(r, "path_regex"):
            out += _route_patterns(getattr(inner, "routes", inner))
    return out


def create_app(client: AsyncEngineClient, tokenizer: Tokenizer, ready: Ready, args: Namespace) -> FastAPI:
    st = ServerState(client, tokenizer, ready, args)
    app = FastAPI(title="v4serve", version=VERSION, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.v4 = st
    install_error_handlers(app)
    app.include_router(openai_chat.router)
    app.include_router(openai_completions.router)
    app.include_router(anthropic.router)
    app.include_router(responses.router)

    @app.get("/health")
    async def health() -> Response:
        if client.alive:
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "engine dead", "detail": (client.fatal or "engine stopped").splitlines()[0]},
                            status_code=503)

    @app.get("/version")
    async def version() -> Response:
        return JSONResponse({"version": VERSION})

    @app.get("/v1/models")
    async def models() -> Response:
        cards = [{"id": name, "object": "model", "created": int(st.started), "owned_by": "v4serve",
                  "root": ready.checkpoint_folder or ready.model, "max_model_len": ready.max_model_len}
                 for name in st.served_names]
        return JSONResponse({"object": "list", "data": cards})

    @app.get("/metrics")
    async def metrics() -> Response:
        stats = None
        if client.alive:
            try:
                stats = await client.stats(timeout=5.0)
            except Exception as err:  # noqa: BLE001 - metrics must still answer
                log.warning("engine stats unavailable: %s", err)
        return Response(st.metrics.render(stats, client.alive), media_type="text/plain; version=0.0.4")

    @app.post("/tokenize")
    async def tokenize(request: Request) -> Response:
        req: TokenizeRequest = parse_body(TokenizeRequest, await request.body())
        st.check_model(req.model)
        if (req.prompt is None) == (req.messages is None):
            raise APIError("send exactly one of `prompt` and `messages`", param="prompt")
        if req.messages is not None:
            thinking, effort = openai_chat.chat_options(req.chat_template_kwargs, req.reasoning_effort, st)
            try:
                text = encode_chat(req.messages, tools_for_prompt(None, req.tools), thinking, effort,
                                   req.add_generation_prompt, family=ready.family,
                                   continue_final_message=req.continue_final_message, plain=st.plain_content)
            except ChatFormatError as err:
                raise openai_chat.format_error(err) from None
            ids = await asyncio.to_thread(tokenizer.encode_marked, text)
        else:
            ids = await asyncio.to_thread(tokenizer.encode, req.prompt, req.add_special_tokens)
        body: dict[str, Any] = {"count": len(ids), "max_model_len": ready.max_model_len, "tokens": ids}
        if req.return_token_strs:
            body["token_strs"] = [tokenizer.id_to_token(t) for t in ids]
        return JSONResponse(body)

    @app.post("/detokenize")
    async def detokenize(request: Request) -> Response:
        req: DetokenizeRequest = parse_body(DetokenizeRequest, await request.body())
        st.check_model(req.model)
        bad = [t for t in req.tokens if not 0 <= t < ready.vocab_size]
        if bad:
            raise APIError(f"tokens: ids {bad[:5]} are outside the vocabulary [0, {ready.vocab_size})",
                           param="tokens")
        return JSONResponse({"prompt": tokenizer.decode(req.tokens)})

    st.metrics.set_routes(_route_patterns(app.routes))
    app.add_middleware(Guard, api_key=getattr(args, "api_key", None),
                       max_bytes=getattr(args, "max_request_bytes", DEFAULT_MAX_REQUEST_BYTES), metrics=st.metrics,
                       log_requests=getattr(args, "enable_log_requests", False))
    origins = getattr(args, "allowed_origins", None)
    if origins:  # outermost: preflight requests are answered before the API-key check
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=origins,
                           allow_methods=getattr(args, "allowed_methods", None) or ["*"],
                           allow_headers=getattr(args, "allowed_headers", None) or ["*"],
                           allow_credentials=getattr(args, "allow_credentials", False))
    return app
