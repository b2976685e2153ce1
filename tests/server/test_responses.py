"""`/v1/responses` (OpenAI Responses API).

Most tests drive the real server (tiny random-weight model, CPU) with the official `openai` client or raw
HTTP: random weights give random text, so they assert structure and invariants, never content. A few run the
app in-process against a scripted engine, where the model's text (reasoning, DSML tool calls) is chosen, to
check the output mapping end to end; and the input mapping and the store are unit-tested.
"""

from __future__ import annotations

import json
import time
import uuid
from argparse import Namespace
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pydantic
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from prometheus_client.parser import text_string_to_metric_families

from v4serve.engine.core import RequestRejected
from v4serve.engine.protocol import Delta, Ready, SamplingMsg
from v4serve.server.app import create_app
from v4serve.server.openai_chat import ChatChoice, ChatPlan
from v4serve.server.responses_events import ResponseAssembler
from v4serve.server.responses_input import to_chat_messages
from v4serve.server.responses_store import ResponseStore
from v4serve.tokenizer import Tokenizer

MODEL = "tiny-v4-flash"
MARKUP = ("｜DSML｜", "<｜", "</think>", "<think>")
D = "｜DSML｜"
EOS = "<｜end▁of▁sentence｜>"
WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather for a city", "strict": True,
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                          "additionalProperties": False}}
LONG_INSTRUCTIONS = ("You are a careful coding agent working in a large repository. " + " ".join(
    f"File src/pkg_{i}.py defines class Gadget{i} with methods load, verify and emit." for i in range(14)))

# A request as Codex CLI sends it (shape of codex-rs's ResponsesApiRequest), trimmed.
CODEX_BODY: dict[str, Any] = {
    "model": MODEL,
    "instructions": "You are Codex, a coding agent. You and the user share the same workspace and collaborate "
                    "to achieve the user's goals. Keep going until the query is completely resolved.",
    "input": [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text":
            "<permissions instructions>Filesystem sandboxing: workspace-write. Approval policy: on-request."
            "</permissions instructions>"}]},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "# AGENTS.md instructions for /repo\n\n<INSTRUCTIONS>Run `make test` "
                                           "before you finish.</INSTRUCTIONS>"},
            {"type": "input_text", "text": "<environment_context>\n  <cwd>/repo</cwd>\n  <shell>bash</shell>\n"
                                           "</environment_context>"}]},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Fix the failing test in tests/test_widget.py"}]},
    ],
    "tools": [
        {"type": "function", "name": "shell", "description": "Runs a shell command and returns its output.",
         "strict": False, "parameters": {"type": "object", "properties": {
             "command": {"type": "array", "items": {"type": "string"}}, "workdir": {"type": "string"},
             "timeout_ms": {"type": "number"}}, "required": ["command"], "additionalProperties": False}},
        {"type": "function", "name": "update_plan", "description": "Updates the task plan.", "strict": False,
         "parameters": {"type": "object", "properties": {"plan": {"type": "array", "items": {"type": "object"}}},
                        "required": ["plan"], "additionalProperties": False}},
        {"type": "custom", "name": "apply_patch", "description": "Edit files with a patch.",
         "format": {"type": "grammar", "syntax": "lark", "definition": "start: begin_patch hunk+ end_patch"}},
        {"type": "web_search"},
    ],
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "reasoning": {"effort": "medium", "summary": "auto"},
    "store": False,
    "stream": True,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "0199a3c2-5b1e-7f20-9c1d-3f6b2a8e4d10",
    "text": {"verbosity": "medium"},
    "client_metadata": {"originator": "codex_cli_rs", "session_id": "0199a3c2-5b1e-7f20-9c1d-3f6b2a8e4d10"},
}


def no_markup(text: str | None) -> bool:
    return not any(m in (text or "") for m in MARKUP)


def sse_events(text: str) -> list[dict[str, Any]]:
    """The events of a Responses stream, checking that each `event:` line names its data's type."""
    events, name = [], None
    for line in text.splitlines():
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            data = json.loads(line[6:])
            assert data["type"] == name
            events.append(data)
    return events


def check_sequence(types: list[str], seqs: list[int]) -> None:
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] in ("response.completed", "response.incomplete")
    assert seqs == list(range(len(seqs)))


# ------------------------------------------------------------------------------------------------------------
# the real server
# ------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def client(tiny_server_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=tiny_server_url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def http(tiny_server_url: str):
    with httpx.Client(base_url=tiny_server_url, timeout=60) as c:
        yield c


def test_string_input(client: openai.OpenAI) -> None:
    r = client.responses.create(model=MODEL, input="Hello", max_output_tokens=6, temperature=0,
                                extra_body={"ignore_eos": True})
    assert r.id.startswith("resp_") and r.object == "response" and r.model == MODEL
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert [o.type for o in r.output] == ["message"]
    msg = r.output[0]
    assert msg.role == "assistant" and msg.content[0].type == "output_text" and msg.content[0].annotations == []
    assert r.output_text == msg.content[0].text and no_markup(r.output_text)
    u = r.usage
    assert u.output_tokens == 6 and u.input_tokens > 0 and u.total_tokens == u.input_tokens + 6
    assert u.input_tokens_details.cached_tokens == 0 and u.output_tokens_details.reasoning_tokens == 0
    assert r.max_output_tokens == 6 and r.temperature == 0 and r.store is True and r.error is None


def test_items_with_instructions_and_developer(client: openai.OpenAI) -> None:
    r = client.responses.create(
        model=MODEL, instructions="Answer briefly.", max_output_tokens=4, temperature=0, top_p=0.9,
        metadata={"ticket": "42"}, user="u1", service_tier="auto", truncation="disabled",
        input=[{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be exact."}]},
               {"role": "user", "content": [{"type": "input_text", "text": "What is"},
                                            {"type": "input_text", "text": "two plus two?"}]}],
        extra_body={"some_future_field": {"x": 1}})  # unknown fields are ignored
    assert r.status in ("completed", "incomplete") and r.output[-1].type == "message"
    assert r.instructions == "Answer briefly." and r.metadata == {"ticket": "42"} and r.top_p == 0.9
    assert r.usage.output_tokens <= 4 and no_markup(r.output_text)


def test_streaming_events_and_text(client: openai.OpenAI) -> None:
    stream = client.responses.create(model=MODEL, input="Count to ten", max_output_tokens=6, temperature=0,
                                     stream=True, extra_body={"ignore_eos": True})
    events = list(stream)
    check_sequence([e.type for e in events], [e.sequence_number for e in events])
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    (done,) = [e.text for e in events if e.type == "response.output_text.done"]
    final = events[-1].response
    assert final.status == "incomplete" and final.usage.output_tokens == 6
    assert deltas == done == final.output_text and no_markup(deltas)
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    kinds = [e.type for e in events if e.type not in ("response.output_text.delta",)]
    assert kinds[2:] == ["response.output_item.added", "response.content_part.added", "response.output_text.done",
                         "response.content_part.done", "response.output_item.done", "response.incomplete"]


def test_streaming_reasoning(client: openai.OpenAI) -> None:
    stream = client.responses.create(model=MODEL, input="Why is the sky blue?", max_output_tokens=6,
                                     reasoning={"effort": "low", "summary": "auto"}, stream=True,
                                     temperature=0, extra_body={"ignore_eos": True})  # fixed text: no_markup below
    events = list(stream)
    check_sequence([e.type for e in events], [e.sequence_number for e in events])
    final = events[-1].response
    reasoning = [o for o in final.output if o.type == "reasoning"]
    assert final.usage.output_tokens_details.reasoning_tokens > 0 and len(reasoning) == 1
    summary = "".join(e.delta for e in events if e.type == "response.reasoning_summary_text.delta")
    assert reasoning[0].summary[0].text == summary and no_markup(summary)
    assert "response.reasoning_summary_part.added" in [e.type for e in events]
    assert final.reasoning.effort == "low"


def test_forced_function_call_and_tool_output_round_trip(client: openai.OpenAI) -> None:
    r = client.responses.create(model=MODEL, input="Weather in Paris?", tools=[WEATHER], max_output_tokens=8,
                                tool_choice={"type": "function", "name": "get_weather"}, temperature=0)
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and calls[0].call_id.startswith("call_")
    assert calls[0].id.startswith("fc_") and isinstance(json.loads(calls[0].arguments), dict)
    assert no_markup(calls[0].arguments) and r.tools[0].name == "get_weather"
    follow = client.responses.create(
        model=MODEL, previous_response_id=r.id, tools=[WEATHER], max_output_tokens=4, temperature=0,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "18 C, sunny"}])
    assert follow.status in ("completed", "incomplete") and follow.previous_response_id == r.id
    assert follow.usage.input_tokens > r.usage.input_tokens


def test_required_tool_call_streams_arguments(client: openai.OpenAI) -> None:
    stream = client.responses.create(model=MODEL, input="Weather?", tools=[WEATHER], tool_choice="required",
                                     max_output_tokens=8, stream=True, temperature=0)
    events = list(stream)
    check_sequence([e.type for e in events], [e.sequence_number for e in events])
    final = events[-1].response
    calls = [o for o in final.output if o.type == "function_call"]
    for call in calls:
        deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta"
                         and e.item_id == call.id)
        (done,) = [e.arguments for e in events if e.type == "response.function_call_arguments.done"
                   and e.item_id == call.id]
        assert deltas == done == call.arguments and no_markup(done)


def test_previous_response_id_store_and_cached_tokens(client: openai.OpenAI) -> None:
    salt = {"cache_salt": f"responses-{uuid.uuid4().hex}"}  # a fresh cache: hits come from this test only
    first = client.responses.create(model=MODEL, instructions=LONG_INSTRUCTIONS, input="Which gadget emits?",
                                    max_output_tokens=4, extra_body=salt)
    assert first.usage.input_tokens > 200 and first.usage.input_tokens_details.cached_tokens == 0
    again = client.responses.create(model=MODEL, instructions=LONG_INSTRUCTIONS, input="Which gadget emits?",
                                    max_output_tokens=4, store=False, extra_body=salt)
    assert 0 < again.usage.input_tokens_details.cached_tokens <= again.usage.input_tokens
    second = client.responses.create(model=MODEL, instructions=LONG_INSTRUCTIONS, previous_response_id=first.id,
                                     input="And which one verifies?", max_output_tokens=4, extra_body=salt)
    assert second.usage.input_tokens > first.usage.input_tokens
    assert second.usage.input_tokens_details.cached_tokens >= 64  # the previous turn's prompt is a prefix
    assert client.responses.retrieve(first.id).output[0].id == first.output[0].id
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(again.id)  # store: false
    for missing in (again.id, "resp_unknown"):
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(model=MODEL, previous_response_id=missing, input="x", max_output_tokens=1)
        assert e.value.body["param"] == "previous_response_id" and missing in e.value.body["message"]
    client.responses.delete(second.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(second.id)


def test_codex_request_is_accepted(http: httpx.Client) -> None:
    body = {**CODEX_BODY, "max_output_tokens": 8}  # Codex sets no cap; random weights would fill the context
    with http.stream("POST", "/v1/responses", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r.read().decode())
    check_sequence([e["type"] for e in events], [e["sequence_number"] for e in events])
    final = events[-1]["response"]
    assert final["status"] == "completed" or final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["store"] is False and final["parallel_tool_calls"] is False
    assert final["usage"]["output_tokens_details"]["reasoning_tokens"] > 0  # effort medium: thinking on
    assert http.get(f"/v1/responses/{final['id']}").status_code == 404  # store: false


@pytest.mark.parametrize("patch, param", [
    ({"temperature": "hot"}, "temperature"),
    ({"max_output_tokens": "10"}, "max_output_tokens"),
    ({"input": 5}, "input"),
    ({"input": [{"type": "message", "role": "robot", "content": "x"}]}, "input[0].role"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:"}]}]},
     "input[0].content[0]"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
    ({"tools": [{"type": "function", "parameters": {"type": "object"}}]}, "tools[0].name"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
    ({"text": {"format": {"type": "xml"}}}, "text.format.type"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nope"}}}}, "text.format"),
    ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
    ({"reasoning": {"summary": 1}}, "reasoning.summary"),
    ({"metadata": {"k": 1}}, "metadata.k"),
    ({"parallel_tool_calls": "no"}, "parallel_tool_calls"),
    ({"store": "yes"}, "store"),
    ({"include": "reasoning.encrypted_content"}, "include"),
    ({"model": "gpt-5"}, "model"),
    ({"max_output_tokens": 5000}, "max_output_tokens"),
    ({"background": True}, "background"),
])
def test_malformed_fields(http: httpx.Client, patch: dict[str, Any], param: str) -> None:
    r = http.post("/v1/responses", json={"model": MODEL, "input": "hi", "max_output_tokens": 2, **patch})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    assert err["param"] == param and len(err["message"]) > 10


def _aborted(http: httpx.Client) -> float:
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in
               text_string_to_metric_families(http.get("/metrics").text) for s in f.samples}
    return samples.get(("v4serve_requests_total", (("finish_reason", "abort"), ("route", "responses"))), 0.0)


def test_stream_disconnect_aborts(http: httpx.Client) -> None:
    before = _aborted(http)
    body = {"model": MODEL, "input": "Tell me everything.", "max_output_tokens": 3000, "stream": True,
            "ignore_eos": True}
    with http.stream("POST", "/v1/responses", json=body) as r:
        deltas = 0
        for line in r.iter_lines():
            deltas += line == "event: response.output_text.delta"
            if deltas == 3:
                break
    deadline = time.monotonic() + 20
    while _aborted(http) < before + 1:
        assert time.monotonic() < deadline, "the engine request was not aborted"
        time.sleep(0.2)


# ------------------------------------------------------------------------------------------------------------
# in-process, scripted model text: the output mapping through the official client
# ------------------------------------------------------------------------------------------------------------
TOK = Tokenizer.from_pretrained(None)


def dsml_call(name: str, **params: Any) -> str:
    body = "\n".join(f'<{D}parameter name="{k}" string="{"true" if isinstance(v, str) else "false"}">'
                     f'{v if isinstance(v, str) else json.dumps(v)}</{D}parameter>' for k, v in params.items())
    return f'<{D}invoke name="{name}">\n{body}\n</{D}invoke>'


SHELL_CALLS = (f"Let me look.</think>Running the tests.\n\n<{D}tool_calls>\n"
               f"{dsml_call('shell', command=['make', 'test'], workdir='/repo')}\n"
               f"{dsml_call('update_plan', plan=[])}\n</{D}tool_calls>{EOS}")


class ScriptedEngine:
    """Stands in for AsyncEngineClient: each request generates `text` token by token."""

    def __init__(self, text: str) -> None:
        self.text, self.alive, self.fatal = text, True, None
        self.prompts: list[str] = []

    async def generate(self, request_id: str, prompt_ids: list[int], sampling: SamplingMsg,
                       cache_salt: str | None = None) -> AsyncIterator[Delta]:
        self.prompts.append(TOK.decode(prompt_ids))
        if "REJECT" in self.prompts[-1]:
            raise RequestRejected("rejected by the engine")
        ids = TOK.encode(self.text)
        out = ids[: sampling.max_tokens] if sampling.max_tokens else ids
        sent = ""
        for j, _ in enumerate(out):
            full = TOK.decode(out[: j + 1], skip_special_tokens=True)
            last = j == len(out) - 1
            yield Delta(request_id, [out[j]], full[len(sent):], last,
                        None if not last else "length" if len(out) < len(ids) else "stop", None, None,
                        len(prompt_ids), j + 1, 0)
            sent = full

    async def abort(self, request_ids: list[str]) -> None:
        pass


def scripted(text: str) -> tuple[openai.AsyncOpenAI, httpx.AsyncClient, ScriptedEngine]:
    engine = ScriptedEngine(text)
    ready = Ready(model=MODEL, family="v4", max_model_len=4096, vocab_size=TOK.vocab_size, eos_token_id=1,
                  capacity="test")
    args = Namespace(model=MODEL, served_model_name=[MODEL], api_key=None, max_request_bytes=1 << 20,
                     default_thinking="auto", max_num_seqs=4, max_queue_len=4, retry_after=1)
    app = create_app(engine, TOK, ready, args)  # type: ignore[arg-type]
    http_client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")
    return openai.AsyncOpenAI(base_url="http://test/v1", api_key="x", http_client=http_client), http_client, engine


STREAM_EVENT = pydantic.TypeAdapter(ResponseStreamEvent)


async def test_codex_request_scripted_completes_with_function_calls(caplog: pytest.LogCaptureFixture) -> None:
    _, http_client, engine = scripted(SHELL_CALLS)
    r = await http_client.post("/v1/responses", json=CODEX_BODY)
    events = sse_events(r.text)
    check_sequence([e["type"] for e in events], [e["sequence_number"] for e in events])
    for event in events:  # every event is valid under the official types, not merely tolerated
        STREAM_EVENT.validate_python(event)
    warnings = [rec.getMessage() for rec in caplog.records if rec.levelname == "WARNING"]
    assert warnings == ["responses: ignored tools ['custom', 'web_search'] (only function tools are supported)"]
    final = events[-1]
    assert final["type"] == "response.completed" and final["response"]["status"] == "completed"
    output = final["response"]["output"]
    assert [o["type"] for o in output] == ["reasoning", "message", "function_call"]  # parallel_tool_calls: false
    assert output[0]["summary"] == [{"type": "summary_text", "text": "Let me look."}]
    assert output[1]["content"][0]["text"] == "Running the tests."
    assert output[2]["name"] == "shell" and output[2]["status"] == "completed"
    assert json.loads(output[2]["arguments"]) == {"command": ["make", "test"], "workdir": "/repo"}
    prompt = engine.prompts[0]
    assert "apply_patch" not in prompt and "web_search" not in prompt and '"name": "shell"' in prompt
    assert prompt.index("You are Codex") < prompt.index("Filesystem sandboxing") < prompt.index("AGENTS.md")
    assert prompt.endswith("<｜Assistant｜><think>")  # effort medium: thinking


async def test_stream_helper_and_continuation_render_history() -> None:
    client, _, engine = scripted(SHELL_CALLS)
    tools = [t for t in CODEX_BODY["tools"] if t["type"] == "function"]
    async with client.responses.stream(model=MODEL, input="Fix it", tools=tools,
                                       reasoning={"effort": "high"}) as stream:
        async for _ in stream:
            pass
        first = await stream.get_final_response()
    calls = [o for o in first.output if o.type == "function_call"]
    assert [c.name for c in calls] == ["shell", "update_plan"]
    assert first.output[0].type == "reasoning" and first.output_text == "Running the tests."
    follow = await client.responses.create(
        model=MODEL, previous_response_id=first.id, tools=tools, reasoning={"effort": "high"},
        input=[{"type": "function_call_output", "call_id": c.call_id, "output": f"out {c.name}"} for c in calls])
    assert follow.status == "completed"
    prompt = engine.prompts[1]
    assert prompt.startswith(engine.prompts[0])  # with tools the history renders as the model wrote it
    assert "<tool_result>out shell</tool_result>\n\n<tool_result>out update_plan</tool_result>" in prompt


async def test_engine_errors() -> None:
    _, http_client, _ = scripted("never")
    r = await http_client.post("/v1/responses", json={"input": "REJECT"})
    assert r.status_code == 400 and r.json()["error"]["message"] == "rejected by the engine"
    r = await http_client.post("/v1/responses", json={"input": "REJECT", "stream": True})
    events = sse_events(r.text)
    assert [e["type"] for e in events] == ["response.created", "response.in_progress", "error", "response.failed"]
    assert events[-1]["response"]["error"] == {"code": "invalid_prompt", "message": "rejected by the engine"}
    for event in events:
        STREAM_EVENT.validate_python(event)


async def test_non_streaming_body_is_a_valid_response() -> None:
    _, http_client, engine = scripted(SHELL_CALLS)
    r = await http_client.post("/v1/responses", json={**CODEX_BODY, "stream": False, "store": True,
                                                      "text": {"format": {"type": "json_schema", "name": "plan",
                                                                          "schema": {"type": "object"}}}})
    body = Response.model_validate(r.json())
    assert body.status == "completed" and body.text.format.type == "json_schema"
    assert "## Response Format" in engine.prompts[0]  # the schema is written into the prompt
    assert (await http_client.get(f"/v1/responses/{body.id}")).json() == r.json()


def test_assembler_maps_dsml_to_items() -> None:
    choice = ChatChoice(0, ChatPlan([1, 2], True, "", True, False))
    out = ResponseAssembler("resp_x", MODEL, 2, {})
    events = out.start()
    for piece in (SHELL_CALLS[:7], SHELL_CALLS[7:40], SHELL_CALLS[40:]):  # chunking does not matter
        events += out.feed(choice.feed(piece))
    choice.num_output_tokens = 9
    events += out.feed(choice.finish("stop")) + out.finish(choice)
    body = out.response()
    assert [o["type"] for o in body["output"]] == ["reasoning", "message", "function_call", "function_call"]
    assert json.loads(body["output"][3]["arguments"]) == {"plan": []}
    added = [e["item"]["type"] for e in events if e["type"] == "response.output_item.added"]
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert added == [d["type"] for d in done] and done == body["output"]
    assert body["status"] == "completed" and body["usage"]["output_tokens"] == 9


def test_input_items_to_chat_messages() -> None:
    items = [
        {"role": "developer", "content": "Be terse."},
        {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "think"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
        {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": '{"command": ["ls"]}'},
        {"type": "web_search_call", "id": "ws_1", "status": "completed"},
        {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "x.py"}]},
    ]
    messages, skipped = to_chat_messages("Sys.", items)
    assert skipped == ["web_search_call"]
    assert messages == [
        {"role": "system", "content": "Sys."}, {"role": "developer", "content": "Be terse."},
        {"role": "user", "content": "a\n\nb"},
        {"role": "assistant", "content": "ok", "reasoning_content": "think", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "shell", "arguments": '{"command": ["ls"]}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "x.py"}]}]


def test_store_is_bounded_lru() -> None:
    store = ResponseStore(max_responses=3, max_bytes=10_000)
    for i in range(4):
        store.put({"id": f"r{i}", "output": []}, [{"role": "user", "content": "x"}])
    assert store.get("r0") is None and len(store) == 3
    store.get("r1")  # used: now the newest
    store.put({"id": "r4", "output": []}, [])
    assert store.get("r2") is None and store.get("r1") is not None
    store.put({"id": "big", "output": []}, [{"content": "y" * 9_950}])
    assert store.bytes <= 10_000 and store.get("big") is not None and len(store) < 3
    store.put({"id": "huge", "output": []}, [{"content": "y" * 20_000}])  # larger than the store: not kept
    assert store.get("huge") is None
