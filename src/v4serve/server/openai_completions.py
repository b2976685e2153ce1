"""`POST /v1/completions`: raw prompts (text or token ids, one or a batch) -> raw generated text.

No chat template, no output parsing: the text is what the model wrote (special tokens skipped unless
`skip_special_tokens: false`). vLLM's `structured_outputs` / `guided_*` and `response_format` constrain it
(server/structured.py; a prompt that ends inside `<think>` is constrained after the model's `</think>`). A text prompt is tokenized as is: no BOS is added (DeepSeek-V4's tokenizer
does not add one; write `<｜begin▁of▁sentence｜>` yourself). A batch of k prompts with n samples each gives
k*n choices, index = prompt * n + sample.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ..engine.protocol import Delta
from .errors import APIError
from .logprobs import CompletionLogprobs
from .openai_chat import sibling_index
from .protocol import CompletionRequest, check_context, parse_body, sampling_for
from .streaming import EngineCall, EventStream, merge, sse, until_disconnected
from .structured import check as check_constraint
from .structured import explicit

if TYPE_CHECKING:
    from .app import ServerState

log = logging.getLogger("v4serve.server")
router = APIRouter()


@dataclass
class _Choice:
    index: int
    prompt_text: str
    logprobs: CompletionLogprobs | None
    text: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    error: str | None = None
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    started: bool = False

    def apply(self, d: Delta, echo: bool) -> dict[str, Any]:
        """Record a delta; returns the stream choice for it."""
        self.num_output_tokens = max(self.num_output_tokens, d.num_output_tokens)
        self.num_cached_tokens = max(self.num_cached_tokens, d.num_cached_tokens)
        text = d.text
        if echo and not self.started:
            text = self.prompt_text + text
        self.started = True
        self.text.append(text)
        lp = self.logprobs.add(d.new_token_ids, d.new_logprobs or []) if self.logprobs else None
        if d.finished:
            self.finish_reason, self.stop_reason, self.error = d.finish_reason or "stop", d.stop_reason, d.error
        return {"index": self.index, "text": text, "logprobs": lp, "finish_reason": self.finish_reason,
                "stop_reason": self.stop_reason}


async def _prompts(st: ServerState, prompt: Any) -> tuple[list[list[int]], list[str]]:
    """(token ids, text) of each prompt in the request."""
    if isinstance(prompt, str) or prompt and isinstance(prompt[0], int):
        prompt = [prompt]
    if not prompt:
        raise APIError("prompt: must not be empty", param="prompt")
    V = st.ready.vocab_size
    if isinstance(prompt[0], str):
        limit = st.ready.max_model_len
        too_long = await asyncio.to_thread(lambda: [st.tokenizer.exceeds(p, limit) for p in prompt])
        if any(too_long):  # refused before tokenizing all of a huge prompt
            i = too_long.index(True)
            raise APIError(f"prompt{f'[{i}]' if len(prompt) > 1 else ''}: has more than {limit} tokens, this "
                           "server's context (--max-model-len); shorten it", param="prompt",
                           code="context_length_exceeded")
        ids = await asyncio.to_thread(lambda: [st.tokenizer.encode(p) for p in prompt])
        texts = list(prompt)
    else:
        ids = [list(p) for p in prompt]
        bad = [t for p in ids for t in p if not 0 <= t < V]
        if bad:
            raise APIError(f"prompt: token ids {bad[:5]} are outside the vocabulary [0, {V})", param="prompt")
        texts = [st.tokenizer.decode(p) for p in ids]
    for i, p in enumerate(ids):
        if not p:
            raise APIError(f"prompt{f'[{i}]' if len(ids) > 1 else ''}: is empty; send at least one token",
                           param="prompt")
    return ids, texts


@router.post("/v1/completions")
async def create_completion(request: Request) -> Response:
    st: ServerState = request.app.state.v4
    arrival = time.monotonic()
    req: CompletionRequest = parse_body(CompletionRequest, await request.body())
    model = st.check_model(req.model)
    n = 1 if req.n is None else req.n
    if req.best_of is not None and req.best_of != n:
        raise APIError("best_of: only best_of equal to n is supported", param="best_of",
                       code="unsupported_parameter")
    ids, texts = await _prompts(st, req.prompt)
    constraint = explicit((req.model_extra or {}).get("response_format"), req.structured_extras())
    spec = await asyncio.to_thread(check_constraint, constraint) if constraint else None
    sampling = sampling_for(req, st.ready.vocab_size, max_tokens=16 if req.max_tokens is None else req.max_tokens,
                            logprobs=req.logprobs, structured=spec)
    for p in ids:
        check_context(len(p), sampling.max_tokens, st.ready.max_model_len, prompt_param="prompt")
    request_id = f"cmpl-{uuid.uuid4().hex}"
    calls: list[EngineCall] = []
    st.admission.reserve(len(ids) * n, st.client, param="prompt" if len(ids) > 1 else "n")
    try:
        for k, p in enumerate(ids):
            rid = request_id if len(ids) == 1 else f"{request_id}-{k}"
            calls.append(EngineCall(st.client, st.admission, st.metrics, "completions", rid, p, sampling,
                                    req.cache_salt, arrival))
    except APIError:
        for c in calls:
            c.close()
        raise
    choices = [_Choice(k * n + i, texts[k], CompletionLogprobs(st.token_text, req.logprobs)
                       if req.logprobs is not None else None) for k in range(len(ids)) for i in range(n)]
    head = {"id": request_id, "object": "text_completion", "created": int(time.time()), "model": model}
    n_prompt = sum(len(p) for p in ids)

    def close() -> None:
        for c in calls:
            c.close()

    if req.stream:
        continuous = bool(req.stream_options and req.stream_options.continuous_usage_stats)
        return EventStream(_stream(calls, choices, n, head, n_prompt, req.echo, req.include_usage, continuous),
                           on_close=close)
    try:
        return await until_disconnected(request, _complete(calls, choices, n, head, n_prompt, req.echo))
    finally:
        close()


def _usage(n_prompt: int, choices: list[_Choice], n: int) -> dict[str, Any]:
    completion = sum(c.num_output_tokens for c in choices)
    cached = sum(c.num_cached_tokens for c in choices[::n])  # each prompt once
    return {"prompt_tokens": n_prompt, "completion_tokens": completion, "total_tokens": n_prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


async def _complete(calls: list[EngineCall], choices: list[_Choice], n: int, head: dict[str, Any], n_prompt: int,
                    echo: bool) -> Response:
    async for k, d in merge([c.deltas() for c in calls]):
        choices[k * n + sibling_index(d.request_id)].apply(d, echo)
    failed = next((c.error for c in choices if c.error and not c.num_output_tokens), None)
    if failed:
        raise APIError(failed, 400, code="engine_error")
    return JSONResponse({**head, "choices": [
        {"index": c.index, "text": "".join(c.text) if c.started or not echo else c.prompt_text,
         "logprobs": c.logprobs.result() if c.logprobs else None, "finish_reason": c.finish_reason,
         "stop_reason": c.stop_reason} for c in choices], "usage": _usage(n_prompt, choices, n)})


async def _stream(calls: list[EngineCall], choices: list[_Choice], n: int, head: dict[str, Any], n_prompt: int,
                  echo: bool, include_usage: bool, continuous: bool) -> AsyncIterator[bytes]:
    try:
        async for k, d in merge([c.deltas() for c in calls]):
            choice = choices[k * n + sibling_index(d.request_id)]
            part = choice.apply(d, echo)
            if d.finished and choice.error and not choice.num_output_tokens:
                raise APIError(choice.error, 400, code="engine_error")
            if part["text"] or part["finish_reason"] or part["logprobs"]:
                body = {**head, "choices": [part]}
                if continuous:
                    body["usage"] = _usage(n_prompt, choices, n)
                yield sse(body)
        if include_usage:
            yield sse({**head, "choices": [], "usage": _usage(n_prompt, choices, n)})
    except APIError as err:
        yield sse(err.openai_body())
    except Exception as err:  # a bug must end the stream with a reason, not a cut connection
        log.exception("error while streaming")
        yield sse(APIError(f"internal server error: {type(err).__name__}: {err}", 500).openai_body())
    yield sse("[DONE]")
