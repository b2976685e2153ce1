"""`POST /v1/chat/completions`: messages -> DeepSeek-V4 prompt -> engine -> reasoning, content, tool calls.

The prompt is built by chat.encode_chat (tools written into the system prompt, `tool_choice` "none" hides
them, "required" / a named function append chat.forced_prefix so the model must call). What the output must follow
(`response_format`, vLLM's `structured_outputs`, a forced call's DSML and argument schema) is checked here and
enforced by the engine (server/structured.py). Output text goes
through parsers.OutputParser, one per choice: reasoning to `reasoning_content`, DSML blocks to `tool_calls`
whose arguments stream as they are generated, never any markup in `content` or `arguments`.
`ChatChoice` does that assembly and knows nothing of HTTP or the engine, so it is tested with scripted text.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ..engine.guided_admission import reasoning_open
from ..engine.protocol import Delta
from ..engine.sampling_params import StructuredOutputsParams
from . import structured
from .chat import (
    ChatFormatError,
    encode_chat,
    forced_prefix,
    tool_choice_mode,
    tools_for_prompt,
    validate_tools,
)
from .errors import APIError
from .logprobs import TokenText, chat_logprobs
from .parsers import (
    ContentDelta,
    Event,
    OutputParser,
    ReasoningDelta,
    ToolCallArgsDelta,
    ToolCallStart,
    collect,
    new_call_id,
)
from .protocol import ChatCompletionRequest, check_context, parse_body, resolve_thinking, sampling_for
from .reasoning import count_reasoning_tokens
from .streaming import EngineCall, EventStream, sse, until_disconnected

if TYPE_CHECKING:
    from .app import ServerState

log = logging.getLogger("v4serve.server")
router = APIRouter()


# ------------------------------------------------------------------------------------------------------------
# prompt
# ------------------------------------------------------------------------------------------------------------
@dataclass
class ChatPlan:
    prompt_ids: list[int]
    thinking: bool
    prefix: str  # forced tool-call opening appended to the prompt ("" when none)
    report_calls: bool  # False for tool_choice "none"
    single_call: bool  # parallel_tool_calls false: only the first call is reported
    structured: StructuredOutputsParams | None = None  # the grammar the engine enforces on the output


def chat_options(kwargs: dict[str, Any] | None, effort: Any, st: ServerState) -> tuple[bool, Any]:
    """(thinking, reasoning_effort) from chat_template_kwargs and the top-level reasoning_effort."""
    kwargs = kwargs or {}
    explicit = kwargs.get("thinking", kwargs.get("enable_thinking"))
    effort = kwargs.get("reasoning_effort", effort)
    return resolve_thinking(explicit, effort, st.args.default_thinking, st.ready.family), effort


def format_error(err: ChatFormatError) -> APIError:
    text = str(err)
    for field in ("tool_choice", "tools", "messages", "response_format", "reasoning_effort"):
        if text.startswith((field, f"unknown {field}")) or f" {field} " in text[:40]:
            return APIError(text, param=field)
    return APIError(text, param="messages" if "conversation" in text else None)


async def plan_chat(st: ServerState, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                    tool_choice: Any, thinking: bool, effort: Any, *, response_format: dict[str, Any] | None = None,
                    add_generation_prompt: bool = True, continue_final_message: bool = False,
                    parallel_tool_calls: bool | None = None, extras: dict[str, Any] | None = None) -> ChatPlan:
    """Encode and tokenize, and check the output constraint (in a worker thread: a long conversation or a first
    grammar must not stall other streams). `extras`: the body's other fields (vLLM's `structured_outputs`)."""
    def build() -> ChatPlan:
        try:
            text = encode_chat(messages, tools_for_prompt(tool_choice, tools), thinking, effort,
                               add_generation_prompt, response_format=response_format, family=st.ready.family,
                               continue_final_message=continue_final_message, plain=st.plain_content)
            prefix = forced_prefix(tool_choice, tools, thinking) if add_generation_prompt else ""
            mode, name = tool_choice_mode(tool_choice, tools) if prefix else ("auto", None)
            functions = validate_tools(tools) if prefix else []
        except ChatFormatError as err:
            raise format_error(err) from None
        constraint = structured.for_chat(response_format, extras or {}, mode, name, functions,
                                         parallel_tool_calls is not False)
        if st.tokenizer.exceeds(text, st.ready.max_model_len):  # refuse before tokenizing all of a huge prompt
            raise APIError(f"the prompt has more than {st.ready.max_model_len} tokens, this server's context "
                           "(--max-model-len); shorten the prompt", param="messages", code="context_length_exceeded")
        report = tool_choice != "none" and bool(tools)
        ids = st.tokenizer.encode_marked(text + prefix)
        tok = st.tokenizer
        # a continued final assistant message: the prompt already closed the reasoning, the output is the answer
        reasoning = thinking and (bool(prefix) or reasoning_open(ids, tok.think_start_id, tok.think_end_id))
        return ChatPlan(ids, reasoning, prefix, report, parallel_tool_calls is False, structured.check(constraint))

    return await asyncio.to_thread(build)


# ------------------------------------------------------------------------------------------------------------
# one choice: parser events -> OpenAI deltas and the final message
# ------------------------------------------------------------------------------------------------------------
class ChatChoice:
    """Assembles one choice from engine text; feed/finish return the parser's events (after the
    parallel_tool_calls filter), `delta_for` turns each into an OpenAI stream delta."""

    def __init__(self, index: int, plan: ChatPlan, *, id_factory: Callable[[], str] = new_call_id,
                 top_logprobs: int | None = None, text_of: TokenText | None = None) -> None:
        self.index = index
        self.plan = plan
        self.parser = OutputParser(plan.thinking, tool_calls=plan.report_calls, id_factory=id_factory)
        self.events: list[Event] = []
        self.token_ids: list[int] = []
        self.top_logprobs, self.text_of = top_logprobs, text_of
        self.logprobs: list[dict[str, Any]] = []  # all, for the non-streaming response
        self._pending_logprobs: list[dict[str, Any]] = []  # not yet attached to a stream chunk
        self.engine_reason: str | None = None
        self.stop_reason: str | int | None = None
        self.error: str | None = None
        self.num_output_tokens = 0
        self.num_cached_tokens = 0
        self.finished = False
        self._prefix_events = self._keep(self.parser.feed(plan.prefix)) if plan.prefix else []

    def start(self) -> list[Event]:
        """Events of the forced prefix (a named function's call starts before the model writes)."""
        events, self._prefix_events = self._prefix_events, []
        return events

    def feed(self, text: str, token_ids: Sequence[int] = (), logprobs: Sequence[dict[int, float]] | None = None,
             ) -> list[Event]:
        self.token_ids.extend(token_ids)
        if logprobs and self.text_of is not None and self.top_logprobs is not None:
            entries = chat_logprobs(self.text_of, token_ids, logprobs, self.top_logprobs)
            self.logprobs += entries
            self._pending_logprobs += entries
        return self.start() + (self._keep(self.parser.feed(text)) if text else [])

    def finish(self, reason: str | None, stop_reason: str | int | None = None, error: str | None = None,
               ) -> list[Event]:
        self.finished = True
        self.engine_reason, self.stop_reason, self.error = reason, stop_reason, error
        return self.start() + self._keep(self.parser.finish())

    def apply(self, d: Delta) -> list[Event]:
        """An engine delta of this choice."""
        self.num_output_tokens = max(self.num_output_tokens, d.num_output_tokens)
        self.num_cached_tokens = max(self.num_cached_tokens, d.num_cached_tokens)
        events = self.feed(d.text, d.new_token_ids, d.new_logprobs)
        if d.finished:
            events += self.finish(d.finish_reason, d.stop_reason, d.error)
        return events

    def _keep(self, events: list[Event]) -> list[Event]:
        if self.plan.single_call:
            events = [e for e in events if getattr(e, "index", 0) == 0]  # text events have no index
        self.events += events
        return events

    # --- results ---------------------------------------------------------------------------------------
    @property
    def made_calls(self) -> bool:
        return any(isinstance(e, ToolCallStart) for e in self.events)

    @property
    def finish_reason(self) -> str | None:
        if not self.finished:
            return None
        if self.made_calls and self.engine_reason == "stop":
            return "tool_calls"
        return self.engine_reason or "stop"

    @property
    def reasoning_tokens(self) -> int:
        return count_reasoning_tokens(self.token_ids, self.plan.thinking and not self.plan.prefix)

    def take_logprobs(self) -> dict[str, Any] | None:
        if self.top_logprobs is None:
            return None
        entries, self._pending_logprobs = self._pending_logprobs, []
        return {"content": entries}

    def message(self) -> dict[str, Any]:
        parsed = collect(self.events)
        msg: dict[str, Any] = {"role": "assistant", "content": parsed.content or (None if parsed.tool_calls else "")}
        if self.plan.thinking or parsed.reasoning:
            # `reasoning` is vLLM's current name, `reasoning_content` the one DeepSeek's API and older clients read
            msg["reasoning"] = msg["reasoning_content"] = parsed.reasoning
        if parsed.tool_calls:
            msg["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name,
                                                                              "arguments": c.arguments}}
                                 for c in parsed.tool_calls]
        return msg


def delta_for(ev: Event) -> dict[str, Any] | None:
    """The OpenAI stream delta of one parser event (None: nothing to send, e.g. a call's end)."""
    if isinstance(ev, ContentDelta):
        return {"content": ev.text}
    if isinstance(ev, ReasoningDelta):
        return {"reasoning": ev.text, "reasoning_content": ev.text}
    if isinstance(ev, ToolCallStart):
        return {"tool_calls": [{"index": ev.index, "id": ev.id, "type": "function",
                                "function": {"name": ev.name, "arguments": ""}}]}
    if isinstance(ev, ToolCallArgsDelta):
        return {"tool_calls": [{"index": ev.index, "function": {"arguments": ev.text}}]}
    return None


def usage(prompt_tokens: int, choices: Sequence[ChatChoice]) -> dict[str, Any]:
    """OpenAI usage; the prompt counts once (n > 1 too) and its cached part is the first choice's."""
    completion = sum(c.num_output_tokens for c in choices)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": choices[0].num_cached_tokens if choices else 0},
            "completion_tokens_details": {"reasoning_tokens": sum(c.reasoning_tokens for c in choices)}}


def sibling_index(request_id: str) -> int:
    _, sep, tail = request_id.rpartition("#")
    return int(tail) if sep and tail.isdigit() else 0


# ------------------------------------------------------------------------------------------------------------
# route
# ------------------------------------------------------------------------------------------------------------
@router.post("/v1/chat/completions")
async def create_chat_completion(request: Request) -> Response:
    st: ServerState = request.app.state.v4
    arrival = time.monotonic()
    req: ChatCompletionRequest = parse_body(ChatCompletionRequest, await request.body())
    model = st.check_model(req.model)
    if req.top_logprobs is not None and not req.logprobs:
        raise APIError("top_logprobs needs logprobs: true", param="top_logprobs")
    thinking, effort = chat_options(req.chat_template_kwargs, req.reasoning_effort, st)
    plan = await plan_chat(st, req.messages, req.tools, req.tool_choice, thinking, effort,
                           response_format=req.response_format, add_generation_prompt=req.add_generation_prompt,
                           continue_final_message=req.continue_final_message,
                           parallel_tool_calls=req.parallel_tool_calls, extras=req.structured_extras())
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    top = (req.top_logprobs or 0) if req.logprobs else None
    sampling = sampling_for(req, st.ready.vocab_size, max_tokens=max_tokens, logprobs=top, max_tokens_param=param,
                            structured=plan.structured)
    check_context(len(plan.prompt_ids), max_tokens, st.ready.max_model_len, prompt_param="messages",
                  max_tokens_param=param)
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    call = EngineCall(st.client, st.admission, st.metrics, "chat", request_id, plan.prompt_ids, sampling,
                      req.cache_salt, arrival)
    choices = [ChatChoice(i, plan, top_logprobs=top, text_of=st.token_text) for i in range(sampling.n)]
    head = {"id": request_id, "object": "chat.completion.chunk", "created": int(time.time()), "model": model}
    if req.stream:
        continuous = bool(req.stream_options and req.stream_options.continuous_usage_stats)
        stream = _stream(call, choices, head, len(plan.prompt_ids), req.include_usage, continuous)
        return EventStream(stream, on_close=call.close)
    try:
        return await until_disconnected(request, _complete(call, choices, head, len(plan.prompt_ids)))
    finally:
        call.close()


async def _complete(call: EngineCall, choices: list[ChatChoice], head: dict[str, Any], n_prompt: int) -> Response:
    async for d in call.deltas():
        choices[sibling_index(d.request_id)].apply(d)
    failed = next((c.error for c in choices if c.error and not c.token_ids), None)
    if failed:
        raise APIError(failed, 400, code="engine_error")
    body = {**head, "object": "chat.completion", "choices": [
        {"index": c.index, "message": c.message(),
         "logprobs": None if c.top_logprobs is None else {"content": c.logprobs},
         "finish_reason": c.finish_reason, "stop_reason": c.stop_reason} for c in choices],
        "usage": usage(n_prompt, choices)}
    return JSONResponse(body)


async def _stream(call: EngineCall, choices: list[ChatChoice], head: dict[str, Any], n_prompt: int,
                  include_usage: bool, continuous: bool) -> AsyncIterator[bytes]:
    def chunk(c: ChatChoice, delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": c.index, "delta": delta, "logprobs": c.take_logprobs(), "finish_reason": finish}
        if finish is not None and c.stop_reason is not None:
            choice["stop_reason"] = c.stop_reason
        body = {**head, "choices": [choice]}
        if continuous:
            body["usage"] = usage(n_prompt, choices)
        return sse(body)

    try:
        for c in choices:
            yield chunk(c, {"role": "assistant", "content": ""})
            for ev in c.start():
                if (delta := delta_for(ev)) is not None:
                    yield chunk(c, delta)
        async for d in call.deltas():
            c = choices[sibling_index(d.request_id)]
            for ev in c.apply(d):
                if (delta := delta_for(ev)) is not None:
                    yield chunk(c, delta)
            if d.finished:
                if c.error and not c.token_ids:
                    raise APIError(c.error, 400, code="engine_error")
                yield chunk(c, {}, c.finish_reason)
        if include_usage:
            yield sse({**head, "choices": [], "usage": usage(n_prompt, choices)})
    except APIError as err:
        yield sse(err.openai_body())
    except Exception as err:  # a bug must end the stream with a reason, not a cut connection
        log.exception("error while streaming")
        yield sse(APIError(f"internal server error: {type(err).__name__}: {err}", 500).openai_body())
    yield sse("[DONE]")
