"""`POST /v1/messages` (Anthropic Messages API) and `POST /v1/messages/count_tokens`.

Coding agents built on Anthropic's API (Claude Code and others) talk this dialect. A request is mapped onto
the OpenAI shape chat.encode_chat takes: `system` -> a system message; `tool_use` blocks -> assistant
`tool_calls`; `thinking` blocks -> `reasoning_content`; `tool_result` blocks -> tool messages (placed before
the user's text of the same turn); `tools[].input_schema` -> function parameters; `tool_choice`
auto / any / tool / none -> auto / required / the named function / none; `thinking.type` enabled / disabled
-> thinking mode (the budget is not enforced). `cache_control` marks are accepted and ignored: the prefix
cache is automatic. Usage follows Anthropic: `input_tokens` excludes `cache_read_input_tokens`.
Output: `thinking`, `text` and `tool_use` content blocks; streamed as message_start, content_block_start /
_delta / _stop, message_delta (stop_reason, usage), message_stop.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict

from .anthropic_events import MessageAssembler
from .errors import APIError
from .openai_chat import ChatChoice, ChatPlan, plan_chat
from .protocol import SamplingExtras, check_context, parse_body, resolve_thinking, sampling_for
from .streaming import EngineCall, EventStream, sse, until_disconnected

if TYPE_CHECKING:
    from .app import ServerState

log = logging.getLogger("v4serve.server")
router = APIRouter()


class _Thinking(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = None


class _ToolChoice(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False


class MessagesRequest(SamplingExtras):
    model_config = ConfigDict(extra="allow", strict=True)
    model: str | None = None
    max_tokens: int
    messages: list[dict[str, Any]]
    system: str | list[dict[str, Any]] | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: _ToolChoice | None = None
    thinking: _Thinking | None = None

    @property
    def stop(self) -> list[str] | None:
        return self.stop_sequences


class CountTokensRequest(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    model: str | None = None
    messages: list[dict[str, Any]]
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: _ToolChoice | None = None
    thinking: _Thinking | None = None


# ------------------------------------------------------------------------------------------------------------
# request mapping
# ------------------------------------------------------------------------------------------------------------
def _text_of(content: Any, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise APIError(f"{where}: content must be a string or a list of blocks", param=where)
    texts = []
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        else:
            raise APIError(f"{where}[{j}]: unsupported block type {kind!r} here (DeepSeek-V4 takes text only)",
                           param=where)
    return "\n\n".join(texts)


def _result_parts(content: Any) -> list[dict[str, Any]]:
    """A tool_result's content as OpenAI parts; images and documents become "[Unsupported image]" etc. in the
    prompt, as DeepSeek's encoder renders non-text tool output."""
    if content is None or isinstance(content, str):
        return [{"type": "text", "text": content or ""}]
    if not isinstance(content, list):
        raise APIError("tool_result content must be a string or a list of blocks", param="messages")
    return [{"type": "text", "text": b.get("text") or ""} if isinstance(b, dict) and b.get("type") == "text"
            else {"type": b.get("type") if isinstance(b, dict) else "unknown"} for b in content]


def to_openai_messages(system: Any, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Anthropic system + messages -> OpenAI-format messages for chat.encode_chat."""
    out: list[dict[str, Any]] = []
    if system:
        out.append({"role": "system", "content": _text_of(system, "system")})
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        role, content = msg.get("role"), msg.get("content")
        if role == "system":  # Claude Code sends one mid-conversation for model names it does not know
            out.append({"role": "system", "content": _text_of(content, f"{where}.content")})
            continue
        if role not in ("user", "assistant"):
            raise APIError(f"{where}.role: must be user, assistant or system, got {role!r}", param=f"{where}.role")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list):
            raise APIError(f"{where}.content: must be a string or a list of blocks", param=f"{where}.content")
        if not blocks and not (role == "assistant" and i == len(messages) - 1):
            raise APIError(f"{where}.content: must not be empty (only a final assistant message may be)",
                           param=f"{where}.content")
        if role == "assistant":
            out.append(_assistant(blocks, where))
            continue
        results, texts = [], []
        for j, block in enumerate(blocks):
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "tool_result":
                content = _result_parts(block.get("content"))
                if block.get("is_error"):
                    content = [{"type": "text", "text": "Error:"}, *content]
                results.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id") or ""),
                                "content": content})
            elif kind == "text":
                texts.append(block.get("text") or "")
            else:
                raise APIError(f"{where}.content[{j}]: unsupported block type {kind!r} in a user message "
                               "(text and tool_result are supported)", param=f"{where}.content")
        out += results
        if texts or not results:
            out.append({"role": "user", "content": "\n\n".join(texts)})
    return out


def _assistant(blocks: list[Any], where: str) -> dict[str, Any]:
    texts, reasoning, calls = [], [], []
    for j, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(block.get("text") or "")
        elif kind == "thinking":
            reasoning.append(block.get("thinking") or "")
        elif kind == "redacted_thinking":
            continue
        elif kind == "tool_use":
            if not isinstance(block.get("name"), str):
                raise APIError(f"{where}.content[{j}]: tool_use needs a name", param=f"{where}.content")
            calls.append({"id": str(block.get("id") or ""), "type": "function",
                          "function": {"name": block["name"], "arguments": block.get("input") or {}}})
        else:
            raise APIError(f"{where}.content[{j}]: unsupported block type {kind!r} in an assistant message",
                           param=f"{where}.content")
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if reasoning:
        msg["reasoning_content"] = "".join(reasoning)
    if calls:
        msg["tool_calls"] = calls
    return msg


def to_openai_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type") not in (None, "custom"):
            raise APIError(f"tools[{i}]: server tool {tool.get('type')!r} is not supported; define client tools "
                           "with name, description and input_schema", param="tools")
        fn = {"name": tool.get("name"), "parameters": tool.get("input_schema") or {"type": "object"}}
        if tool.get("description") is not None:
            fn["description"] = tool["description"]
        out.append({"type": "function", "function": fn})
    return out


def to_openai_tool_choice(choice: _ToolChoice | None) -> Any:
    if choice is None or choice.type == "auto":
        return "auto"
    if choice.type == "any":
        return "required"
    if choice.type == "none":
        return "none"
    if not choice.name:
        raise APIError('tool_choice: type "tool" needs a name', param="tool_choice")
    return {"type": "function", "function": {"name": choice.name}}


async def _plan(st: ServerState, req: MessagesRequest | CountTokensRequest) -> ChatPlan:
    explicit = None if req.thinking is None or req.thinking.type == "adaptive" else req.thinking.type == "enabled"
    thinking = resolve_thinking(explicit, None, st.args.default_thinking, st.ready.family)
    tools = to_openai_tools(req.tools)
    tool_choice = to_openai_tool_choice(req.tool_choice)  # validated even without tools (a nameless "tool" is a 400)
    tool_choice = tool_choice if tools else "auto"
    parallel = not (req.tool_choice and req.tool_choice.disable_parallel_tool_use)
    return await plan_chat(st, to_openai_messages(req.system, req.messages), tools, tool_choice, thinking, None,
                           parallel_tool_calls=parallel)


def _message_id() -> str:
    return f"msg_{uuid.uuid4().hex[:24]}"


def tool_use_id_factory() -> Callable[[], str]:
    return lambda: f"toolu_{uuid.uuid4().hex[:24]}"


# ------------------------------------------------------------------------------------------------------------
# routes
# ------------------------------------------------------------------------------------------------------------
@router.post("/v1/messages/count_tokens")
async def count_tokens(request: Request) -> Response:
    st: ServerState = request.app.state.v4
    req: CountTokensRequest = parse_body(CountTokensRequest, await request.body())
    st.check_model(req.model)
    plan = await _plan(st, req)
    return JSONResponse({"input_tokens": len(plan.prompt_ids)})


@router.post("/v1/messages")
async def create_message(request: Request) -> Response:
    st: ServerState = request.app.state.v4
    arrival = time.monotonic()
    req: MessagesRequest = parse_body(MessagesRequest, await request.body())
    model = st.check_model(req.model)
    if req.n not in (None, 1):
        raise APIError("n: the Messages API returns one message", param="n")
    plan = await _plan(st, req)
    sampling = sampling_for(req, st.ready.vocab_size,  # type: ignore[arg-type] - the same sampling fields
                            max_tokens=req.max_tokens, logprobs=None, structured=plan.structured)
    check_context(len(plan.prompt_ids), req.max_tokens, st.ready.max_model_len, prompt_param="messages")
    message_id = _message_id()
    call = EngineCall(st.client, st.admission, st.metrics, "messages", message_id, plan.prompt_ids, sampling,
                      req.cache_salt, arrival)
    choice = ChatChoice(0, plan, id_factory=tool_use_id_factory())
    out = MessageAssembler(message_id, model, len(plan.prompt_ids))
    if req.stream:
        return EventStream(_stream(call, choice, out), on_close=call.close)
    try:
        return await until_disconnected(request, _complete(call, choice, out))
    finally:
        call.close()


async def _complete(call: EngineCall, choice: ChatChoice, out: MessageAssembler) -> Response:
    async for d in call.deltas():
        choice.apply(d)
    if choice.error and not choice.token_ids:
        raise APIError(choice.error, 400)
    return JSONResponse(out.message(choice))


async def _stream(call: EngineCall, choice: ChatChoice, out: MessageAssembler) -> AsyncIterator[bytes]:
    try:
        started = False
        async for d in call.deltas():
            events = choice.apply(d)
            if not started:
                started = True
                yield out.start(choice)
            for name, data in out.events(choice, events):
                yield sse(data, name)
            if d.finished:
                if choice.error and not choice.token_ids:
                    raise APIError(choice.error, 400)
                for name, data in out.finish(choice):
                    yield sse(data, name)
    except APIError as err:
        yield sse(err.anthropic_body(), "error")
    except Exception as err:  # a bug must end the stream with a reason, not a cut connection
        log.exception("error while streaming")
        yield sse(APIError(f"internal server error: {type(err).__name__}: {err}", 500).anthropic_body(), "error")

