"""`POST /v1/responses` (OpenAI Responses API), `GET` / `DELETE /v1/responses/{id}`.

Codex CLI and newer OpenAI SDK clients talk this dialect. A request is mapped onto the chat route's pieces
(responses_input.py: input items -> chat messages, flat function tools -> chat tools; other tool types are
ignored with one warning line per request, the model cannot run them), then planned, run and parsed exactly
as a chat completion: `tool_choice`, `reasoning.effort` (-> thinking on/off and effort, as
`reasoning_effort`), `text.format` (-> `response_format`) and `parallel_tool_calls` mean what they mean on the
chat route. Output items and stream events: responses_events.py. `store` / `previous_response_id`: the
in-memory responses_store.py; a follow-up continues the stored input + output of the previous response
(its `instructions` are not carried over, as OpenAI documents).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from .errors import APIError
from .openai_chat import ChatChoice, ChatPlan, chat_options, plan_chat
from .protocol import check_context, parse_body, sampling_for
from .reasoning import effort_preamble
from .responses_events import ResponseAssembler, encode, new_id
from .responses_input import (
    ResponsesRequest,
    echo_fields,
    input_items,
    to_chat_messages,
    to_chat_tool_choice,
    to_chat_tools,
    to_response_format,
)
from .responses_store import ResponseStore
from .streaming import EngineCall, EventStream, until_disconnected

if TYPE_CHECKING:
    from .app import ServerState

log = logging.getLogger("v4serve.server")
router = APIRouter()


_PARAMS = {"messages": "input", "tools": "tools", "tool_choice": "tool_choice", "response_format": "text.format",
           "reasoning_effort": "reasoning.effort"}


async def _plan(st: ServerState, req: ResponsesRequest, items: list[dict[str, Any]]) -> ChatPlan:
    messages, skipped = to_chat_messages(req.instructions, items)
    tools, ignored = to_chat_tools(req.tools)
    if ignored or skipped:  # one line per request: agents send hosted tools on every turn
        what = [f"{label} {sorted(set(kinds))}" for label, kinds in (("tools", ignored), ("input items", skipped))
                if kinds]
        log.warning("responses: ignored %s (only function tools are supported)", " and ".join(what))
    tool_choice, tools = to_chat_tool_choice(req.tool_choice, tools)
    effort = req.reasoning.effort if req.reasoning else None
    thinking, effort = chat_options(req.chat_template_kwargs, effort, st)
    try:
        effort_preamble(None if effort == "none" else effort, st.ready.family, True)
    except ValueError as err:
        raise APIError(str(err).replace("reasoning_effort", "reasoning.effort"), param="reasoning.effort") from None
    try:
        return await plan_chat(st, messages, tools or None, tool_choice, thinking, effort,
                               response_format=to_response_format(req.text),
                               parallel_tool_calls=req.parallel_tool_calls)
    except APIError as err:
        err.param = _PARAMS.get(err.param or "", err.param)
        raise


# ------------------------------------------------------------------------------------------------------------
# routes
# ------------------------------------------------------------------------------------------------------------
def store_of(request: Request) -> ResponseStore:
    store = getattr(request.app.state, "responses_store", None)
    if store is None:
        store = request.app.state.responses_store = ResponseStore()
    return store


def _not_found(response_id: str) -> APIError:
    return APIError(f"no response with id {response_id!r} is stored here (this server keeps the last responses "
                    "created with store: true in memory)", 404, param="response_id", code="not_found")


@router.get("/v1/responses/{response_id}")
async def get_response(request: Request, response_id: str) -> Response:
    entry = store_of(request).get(response_id)
    if entry is None:
        raise _not_found(response_id)
    return JSONResponse(entry.response)


@router.delete("/v1/responses/{response_id}")
async def delete_response(request: Request, response_id: str) -> Response:
    if not store_of(request).delete(response_id):
        raise _not_found(response_id)
    return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})


@router.post("/v1/responses")
async def create_response(request: Request) -> Response:
    st: ServerState = request.app.state.v4
    arrival = time.monotonic()
    req: ResponsesRequest = parse_body(ResponsesRequest, await request.body())
    model = st.check_model(req.model)
    if req.n not in (None, 1):
        raise APIError("n: the Responses API returns one response", param="n")
    if req.background:
        raise APIError("background: background responses are not supported; stream instead", param="background",
                       code="unsupported_parameter")
    for name in ("conversation", "prompt"):
        if (req.model_extra or {}).get(name) is not None:
            raise APIError(f"{name}: stored {name}s are not supported; send input (and previous_response_id)",
                           param=name, code="unsupported_parameter")
    store = store_of(request)
    history: list[dict[str, Any]] = []
    if req.previous_response_id is not None:
        previous = store.get(req.previous_response_id)
        if previous is None:
            raise APIError(f"previous response with id {req.previous_response_id!r} not found (never stored, "
                           "created with store: false, or evicted from this server's in-memory store)",
                           param="previous_response_id", code="previous_response_not_found")
        history = previous.conversation()
    elif req.input is None:
        raise APIError("input: this field is required", param="input", code="missing_required_parameter")
    items = history + input_items(req.input)
    plan = await _plan(st, req, items)
    sampling = sampling_for(req, st.ready.vocab_size,  # type: ignore[arg-type] - the same sampling fields
                            max_tokens=req.max_output_tokens, logprobs=None, max_tokens_param="max_output_tokens",
                            structured=plan.structured)
    check_context(len(plan.prompt_ids), req.max_output_tokens, st.ready.max_model_len, prompt_param="input",
                  max_tokens_param="max_output_tokens")
    response_id = new_id("resp")
    call = EngineCall(st.client, st.admission, st.metrics, "responses", response_id, plan.prompt_ids, sampling,
                      req.cache_salt, arrival)
    choice = ChatChoice(0, plan)
    out = ResponseAssembler(response_id, model, len(plan.prompt_ids), echo_fields(req))

    def done(body: dict[str, Any]) -> None:
        if req.store is not False and body["status"] != "failed":
            store.put(body, items)

    if req.stream:
        return EventStream(_stream(call, choice, out, done), on_close=call.close)
    try:
        return await until_disconnected(request, _complete(call, choice, out, done))
    finally:
        call.close()


async def _complete(call: EngineCall, choice: ChatChoice, out: ResponseAssembler,
                    done: Callable[[dict[str, Any]], None]) -> Response:
    out.feed(choice.start())
    async for d in call.deltas():
        out.feed(choice.apply(d))
    if choice.error and not choice.token_ids:
        raise APIError(choice.error, 400, code="engine_error")
    out.finish(choice)
    body = out.response()
    done(body)
    return JSONResponse(body)


async def _stream(call: EngineCall, choice: ChatChoice, out: ResponseAssembler,
                  done: Callable[[dict[str, Any]], None]) -> AsyncIterator[bytes]:
    try:
        yield encode(out.start() + out.feed(choice.start()))
        async for d in call.deltas():
            if events := out.feed(choice.apply(d)):
                yield encode(events)
            if d.finished and choice.error and not choice.token_ids:
                raise APIError(choice.error, 400, code="engine_error")
        final = out.finish(choice)
        done(out.response())  # before the last event: a client may disconnect as soon as it has it
        yield encode(final)
    except APIError as err:
        yield encode(out.fail(err))
    except Exception as err:  # a bug must end the stream with a reason, not a cut connection
        log.exception("error while streaming a response")
        yield encode(out.fail(APIError(f"internal server error: {type(err).__name__}: {err}", 500)))
