"""Enforced structured output against the real server (tiny random-weight model, CPU) with the official `openai`
client: the model writes random text, so only the engine's grammar makes these outputs valid.

Schemas here bound every string, number and array and the grammar bounds whitespace, so a constrained output always
completes well within max_tokens; `json_object` cannot bound its strings (see test_json_object_returns_json).
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from json_prefix import json_prefix

MODEL = "tiny-v4-flash"
PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "pet": {"type": "string", "enum": ["cat", "dog", "none"]},
    "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}, "maxItems": 2},
    "ok": {"type": "boolean"}},
    "required": ["name", "age", "pet", "tags", "ok"], "additionalProperties": False}
PERSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
BUDGET = 600  # above the longest output the schema and the whitespace bound allow
FORECAST = {"type": "function", "function": {
    "name": "forecast", "description": "Weather forecast",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 10}, "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city", "days", "unit"]}}}
CLOCK = {"type": "function", "function": {"name": "clock", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string", "enum": ["utc", "local"]}}, "required": ["zone"]}}}


@pytest.fixture(scope="module")
def client(tiny_server_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=tiny_server_url + "/v1", api_key="unused", max_retries=0, timeout=600)


@pytest.fixture(scope="module")
def http(tiny_server_url: str):
    with httpx.Client(base_url=tiny_server_url, timeout=300) as c:
        yield c


def ask(client: openai.OpenAI, seed: int, **kw: Any) -> Any:
    kw.setdefault("messages", [{"role": "user", "content": "Describe a person as JSON."}])
    kw.setdefault("max_tokens", BUDGET)
    return client.chat.completions.create(model=MODEL, seed=seed, **kw)


def test_twenty_json_schema_requests_all_validate(client: openai.OpenAI) -> None:
    with ThreadPoolExecutor(20) as pool:  # at once: they share engine steps
        replies = list(pool.map(lambda seed: ask(client, seed, response_format=PERSON_FORMAT), range(20)))
    for r in replies:
        choice = r.choices[0]
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content), PERSON)


def test_json_schema_streaming(client: openai.OpenAI) -> None:
    stream = ask(client, 21, response_format=PERSON_FORMAT, stream=True, stream_options={"include_usage": True})
    text, finish = "", None
    for chunk in stream:
        for c in chunk.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    assert finish == "stop"
    jsonschema.validate(json.loads(text), PERSON)


def test_json_object_returns_json(client: openai.OpenAI) -> None:
    """Any JSON object: its strings are unbounded and a random model almost never closes one by chance, so the
    prompt shows a small object and a repetition penalty below 1 makes the model reuse its tokens (as a trained
    model would follow the example). Only the grammar makes the result JSON; a request that runs out of tokens must
    still be the beginning of a JSON object."""
    messages = [{"role": "user", "content": 'Reply with a JSON object like {"a": "b"}'}]
    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(lambda seed: ask(client, seed, messages=messages, max_tokens=300,
                                                 response_format={"type": "json_object"},
                                                 extra_body={"repetition_penalty": 0.2}), range(4)))
    finished = 0
    for r in replies:
        text = r.choices[0].message.content
        assert text.lstrip().startswith("{") and json_prefix(text), text
        if r.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(text), dict)
            finished += 1
    assert finished >= 1


@pytest.mark.parametrize("extra, check", [
    ({"structured_outputs": {"regex": r"[a-z]{3}-[0-9]{2}"}}, lambda t: re.fullmatch(r"[a-z]{3}-[0-9]{2}", t)),
    ({"structured_outputs": {"choice": ["red", "green", "blue"]}}, lambda t: t in ("red", "green", "blue")),
    ({"structured_outputs": {"grammar": 'root ::= "yes" | "no"'}}, lambda t: t in ("yes", "no")),
    ({"structured_outputs": {"json": PERSON}}, lambda t: jsonschema.validate(json.loads(t), PERSON) is None),
    ({"guided_regex": r"[0-9]{4}"}, lambda t: re.fullmatch(r"[0-9]{4}", t)),
    ({"guided_choice": ["up", "down"]}, lambda t: t in ("up", "down")),
    ({"guided_json": json.dumps(PERSON)}, lambda t: jsonschema.validate(json.loads(t), PERSON) is None),
])
def test_vllm_structured_outputs(client: openai.OpenAI, extra: dict[str, Any], check: Any) -> None:
    r = ask(client, 3, messages=[{"role": "user", "content": "Pick one."}], extra_body=extra)
    assert r.choices[0].finish_reason == "stop" and check(r.choices[0].message.content), r.choices[0].message.content


def test_completions_route(client: openai.OpenAI) -> None:
    r = client.completions.create(model=MODEL, prompt="Person:", max_tokens=BUDGET, seed=5,
                                  extra_body={"structured_outputs": {"json": PERSON}})
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].text), PERSON)


def test_responses_text_format(client: openai.OpenAI) -> None:
    r = client.responses.create(model=MODEL, input="Describe a person.", max_output_tokens=BUDGET, store=False,
                                text={"format": {"type": "json_schema", "name": "person", "schema": PERSON,
                                                 "strict": True}}, extra_body={"seed": 6})
    assert r.status == "completed"
    jsonschema.validate(json.loads(r.output_text), PERSON)


def test_thinking_the_constraint_starts_after_the_reasoning(client: openai.OpenAI) -> None:
    thinking = {"chat_template_kwargs": {"thinking": True}}
    # the reasoning is free: the random model never writes </think> in 12 tokens, and its text is not forced to JSON
    r = ask(client, 7, response_format=PERSON_FORMAT, max_tokens=12, extra_body=thinking)
    reasoning = r.choices[0].message.model_extra["reasoning_content"]
    assert r.choices[0].finish_reason == "length" and reasoning and not reasoning.lstrip().startswith("{")
    # a reasoning that has ended (a continued assistant turn after its </think>): the answer follows the schema
    messages = [{"role": "user", "content": "Describe a person as JSON."},
                {"role": "assistant", "content": "", "reasoning_content": "A short JSON object.", "prefix": True}]
    r = ask(client, 8, messages=messages, response_format=PERSON_FORMAT, extra_body=thinking)
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "forecast"}}])
def test_forced_tool_calls_are_valid_dsml_matching_the_schema(client: openai.OpenAI, tool_choice: Any) -> None:
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (FORECAST, CLOCK)}
    with ThreadPoolExecutor(3) as pool:
        replies = list(pool.map(lambda seed: ask(client, seed, messages=[{"role": "user", "content": "Weather?"}],
                                                 tools=[FORECAST, CLOCK], tool_choice=tool_choice,
                                                 parallel_tool_calls=False), range(3)))
    for r in replies:
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
        call = choice.message.tool_calls[0].function
        if tool_choice != "required":
            assert call.name == "forecast"
        jsonschema.validate(json.loads(call.arguments), schemas[call.name])
        assert not choice.message.content


@pytest.mark.parametrize("body, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
     "response_format"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"structured_outputs": {"regex": "(("}}, "structured_outputs.regex"),
    ({"structured_outputs": {"grammar": "root ::= undefined_rule"}}, "structured_outputs.grammar"),
    ({"structured_outputs": {"json": {"type": "object"}, "regex": "a"}}, "structured_outputs"),
    ({"structured_outputs": {"bogus": 1}}, "structured_outputs.bogus"),
    ({"structured_outputs": "json"}, "structured_outputs"),
    ({"guided_choice": []}, "guided_choice"),
    ({"response_format": {"type": "json_object"}, "guided_regex": "a+"}, "guided_regex"),
])
def test_bad_constraints_are_400_naming_the_field(http: httpx.Client, body: dict[str, Any], param: str) -> None:
    r = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 4,
                                                **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error" and len(err["message"]) > 20


def test_bad_text_format_on_responses_names_text_format(http: httpx.Client) -> None:
    r = http.post("/v1/responses", json={"input": "x", "max_output_tokens": 4, "text": {
        "format": {"type": "json_schema", "name": "x", "schema": {"type": "nope"}}}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "text.format"
