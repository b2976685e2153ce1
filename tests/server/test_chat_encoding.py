"""encode_chat against DeepSeek's reference encoder (byte-identical), plus validation, prefix stability
across turns, tool_choice and the V4.1 effort mapping."""

from __future__ import annotations

import copy
import itertools
import json
from typing import Any

import pytest
from dsv4_reference import reference, tokenizer

from v4serve.server.chat import (
    ASSISTANT,
    BOS,
    EOS,
    THINK_END,
    THINK_START,
    USER,
    ChatFormatError,
    encode_chat,
    forced_prefix,
    tools_for_prompt,
)
from v4serve.server.parsers import OutputParser, collect, parse_completion
from v4serve.server.reasoning import reasoning_budget

# --------------------------------------------------------------------------------------------------------
# Corpus
# --------------------------------------------------------------------------------------------------------


def fn(name: str, description: str = "", **props: Any) -> dict[str, Any]:
    schema = {"type": "object", "properties": props, "required": list(props)}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": schema}}


READ = fn("read_file", "Read a file from disk.", path={"type": "string"}, limit={"type": "integer"})
BASH = fn("bash", "Run a shell command.", command={"type": "string"}, timeout={"type": "number"})
SEARCH = fn("search", "Search the web (网页搜索).", query={"type": "string"}, filters={"type": "object"})
TOOLS = [READ, BASH, SEARCH]


def call(call_id: str | None, name: str, args: dict[str, Any] | str) -> dict[str, Any]:
    arguments = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    out: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if call_id is not None:
        out["id"] = call_id
    return out


def asst(content: str = "", reasoning: str | None = None, calls: list[dict[str, Any]] | None = None) -> dict:
    msg: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        msg["reasoning_content"] = reasoning
    if calls:
        msg["tool_calls"] = calls
    return msg


def tool(call_id: str, content: Any) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def user(text: Any) -> dict[str, Any]:
    return {"role": "user", "content": text}


def system(text: Any) -> dict[str, Any]:
    return {"role": "system", "content": text}


SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
JSON_SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}

AGENT_LOOP = [
    system("You are a coding agent. Work in /repo."),
    user("Fix the failing test in tests/test_a.py"),
    asst("", "I should look at the test first.", [call("c1", "read_file", {"path": "tests/test_a.py"})]),
    tool("c1", "def test_a():\n    assert add(1, 2) == 4\n"),
    asst(
        "The test is wrong.",
        "1+2 is 3, the test expects 4.",
        [call("c2", "bash", {"command": "sed -i 's/== 4/== 3/' tests/test_a.py", "timeout": 30})],
    ),
    tool("c2", ""),
    asst("Fixed: the assertion now expects 3.", "Done."),
    user("Now run the whole suite."),
    asst("", "Run pytest.", [call("c3", "bash", {"command": "pytest -q"})]),
    tool("c3", "12 passed in 0.5s"),
]

CASES: dict[str, dict[str, Any]] = {
    "single_user": {"messages": [user("Hello")]},
    "system_user": {"messages": [system("Be brief."), user("What is 2+2?")]},
    "multi_turn": {"messages": [system("S"), user("Hi"), asst("Hello!"), user("How are you?")]},
    "multi_turn_reasoning": {
        "messages": [user("Q1"), asst("A1", "think 1"), user("Q2"), asst("A2", "think 2"), user("Q3")]
    },
    "tools_no_system": {"messages": [user("Read a.py")], "tools": TOOLS},
    "tools_with_system": {"messages": [system("You code."), user("Read a.py")], "tools": TOOLS},
    "tools_system_none_content": {"messages": [system(None), user("hi")], "tools": [READ]},
    "single_call_pending": {
        "messages": [
            user("Read a.py"),
            asst("", "Need the file.", [call("c1", "read_file", {"path": "a.py"})]),
            tool("c1", "print('hi')"),
        ],
        "tools": TOOLS,
    },
    "parallel_calls_results_reversed": {
        "messages": [
            user("Read both"),
            asst(
                "",
                "Both.",
                [
                    call("a", "read_file", {"path": "a.py"}),
                    call("b", "read_file", {"path": "b.py"}),
                    call("c", "bash", {"command": "ls"}),
                ],
            ),
            tool("c", "a.py b.py"),
            tool("b", "B"),
            tool("a", "A"),
        ],
        "tools": TOOLS,
    },
    "results_then_user_text": {
        "messages": [
            user("Go"),
            asst("", None, [call("a", "bash", {"command": "date"}), call("b", "bash", {"command": "id"})]),
            tool("b", "uid=0"),
            tool("a", "Mon"),
            user("Also check disk usage."),
        ],
        "tools": TOOLS,
    },
    "agent_loop": {"messages": AGENT_LOOP, "tools": TOOLS},
    "agent_loop_without_tools": {"messages": AGENT_LOOP},
    "content_and_calls": {
        "messages": [
            user("x"),
            asst("Let me check.", "hm", [call("c1", "search", {"query": "x"})]),
            tool("c1", "r"),
        ],
        "tools": TOOLS,
    },
    "json_typed_arguments": {
        "messages": [
            user("x"),
            asst(
                "",
                "",
                [
                    call(
                        "c1",
                        "search",
                        {
                            "query": "q",
                            "filters": {"year": 2024, "tags": ["a", "b"], "exact": True, "lang": None},
                            "page": 2,
                            "score": 0.5,
                            "ids": [1, [2, 3]],
                            "flag": False,
                        },
                    )
                ],
            ),
            tool("c1", "ok"),
        ],
        "tools": TOOLS,
    },
    "unicode": {
        "messages": [
            system("你是助手 🤖"),
            user("Résumé: naïve café — 日本語 😀"),
            asst(
                "好的", "思考…", [call("c1", "search", {"query": "東京 天気 ☀", "filters": {"emoji": "🎉"}})]
            ),
            tool("c1", "晴れ ☀️"),
        ],
        "tools": TOOLS,
    },
    "tool_result_parts": {
        "messages": [
            user("x"),
            asst("", None, [call("c1", "bash", {"command": "ls"})]),
            tool(
                "c1",
                [
                    {"type": "text", "text": "part one"},
                    {"type": "text", "text": "part two"},
                    {"type": "image_url", "image_url": {"url": "data:"}},
                ],
            ),
        ],
        "tools": TOOLS,
    },
    "developer_head": {
        "messages": [{"role": "developer", "content": "Follow the style guide."}, user("Write code")]
    },
    "developer_then_turns": {
        "messages": [{"role": "developer", "content": "Dev rules."}, user("Q1"), asst("A1", "r1"), user("Q2")]
    },
    "developer_head_tools": {
        "messages": [{"role": "developer", "content": "Dev."}, user("Q")],
        "tools": [BASH],
    },
    "consecutive_users": {"messages": [user("First part."), user("Second part.")]},
    "reasoning_only_assistant": {"messages": [user("Q"), asst("", "only thinking"), user("Q again")]},
    "response_format": {
        "messages": [system("Answer in JSON."), user("Capital of France?")],
        "response_format": JSON_SCHEMA_FORMAT,
    },
    "response_format_and_tools": {
        "messages": [user("Q")],
        "tools": [READ],
        "response_format": JSON_SCHEMA_FORMAT,
    },
    "empty_object_arguments": {
        "messages": [user("time?"), asst("", None, [call("c1", "bash", "{}")]), tool("c1", "noon")],
        "tools": TOOLS,
    },
    "calls_without_ids": {
        "messages": [
            user("x"),
            asst("", None, [call(None, "bash", {"command": "a"}), call(None, "bash", {"command": "b"})]),
            tool("", "A"),
            tool("", "B"),
        ],
        "tools": TOOLS,
    },
    "unknown_result_ids": {
        "messages": [
            user("x"),
            asst("", None, [call("a", "bash", {"command": "a"}), call("b", "bash", {"command": "b"})]),
            tool("zzz", "Z"),
            tool("b", "B"),
            tool("a", "A"),
        ],
        "tools": TOOLS,
    },
    "markup_lookalikes_in_text": {
        "messages": [
            user("What does <think> mean? And </think>? a < b > c"),
            asst("It is a tag. 1 < 2."),
            user("ok"),
        ]
    },
    "string_args_with_specials": {
        "messages": [
            user("x"),
            asst("", None, [call("c1", "bash", {"command": "echo \"a\\nb\" | grep 'x' > /tmp/o\n\tdone"})]),
            tool("c1", ""),
        ],
        "tools": TOOLS,
    },
    "long_system_prompt": {"messages": [system("Rule.\n" * 200), user("Go")], "tools": TOOLS},
    "three_turns_reasoning_tools": {
        "messages": [user("A"), asst("a", "ra"), user("B"), asst("b", "rb"), user("C")],
        "tools": [READ],
    },
}
assert len(CASES) >= 25


def reference_input(case: dict[str, Any], developer_as_system: bool = True) -> list[dict[str, Any]]:
    """The documented OpenAI -> V4 mapping for these inputs: developer as system (by default), tools and
    response schema on the leading system/developer message (an empty system message when there is none)."""
    messages = copy.deepcopy(case["messages"])
    if developer_as_system:
        for m in messages:
            m["role"] = "system" if m["role"] == "developer" else m["role"]
    tools, response_format = case.get("tools"), case.get("response_format")
    if tools or response_format:
        if messages[0]["role"] not in ("system", "developer"):
            messages.insert(0, {"role": "system", "content": ""})
        if tools:
            messages[0]["tools"] = tools
        if response_format:
            messages[0]["response_format"] = response_format["json_schema"]["schema"]
    return messages


def ours(case: dict[str, Any], thinking: bool, effort: str | None, **kw: Any) -> str:
    return encode_chat(
        case["messages"],
        case.get("tools"),
        thinking,
        effort,
        response_format=case.get("response_format"),
        **kw,
    )


@pytest.mark.parametrize("effort", [None, "high", "max"])
@pytest.mark.parametrize("thinking", [True, False], ids=["thinking", "chat"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_identical_to_reference(name: str, thinking: bool, effort: str | None) -> None:
    case = CASES[name]
    expected = reference().encode_messages(
        reference_input(case), thinking_mode="thinking" if thinking else "chat", reasoning_effort=effort
    )
    assert ours(case, thinking, effort) == expected


DEVELOPER_CASES = [n for n in sorted(CASES) if any(m["role"] == "developer" for m in CASES[n]["messages"])]


@pytest.mark.parametrize("thinking", [True, False], ids=["thinking", "chat"])
@pytest.mark.parametrize("name", DEVELOPER_CASES)
def test_v4_developer_role_identical_to_reference(name: str, thinking: bool) -> None:
    case = CASES[name]
    expected = reference().encode_messages(
        reference_input(case, developer_as_system=False), thinking_mode="thinking" if thinking else "chat"
    )
    assert ours(case, thinking, None, developer_as_system=False) == expected
    assert ours(case, thinking, None) != expected  # the default maps developer to system


@pytest.mark.parametrize("thinking", [True, False], ids=["thinking", "chat"])
def test_effort_names_without_prompt_effect_in_v4(thinking: bool) -> None:
    case = CASES["agent_loop"]
    base = ours(case, thinking, None)
    for effort in ("minimal", "low", "medium", "high", "xhigh"):
        assert ours(case, thinking, effort) == base
    assert ("Reasoning Effort: Absolute maximum" in ours(case, thinking, "max")) == thinking


def test_reasoning_effort_none_means_chat_mode() -> None:
    case = CASES["multi_turn"]
    assert ours(case, True, "none") == ours(case, False, None)


@pytest.mark.parametrize("name", ["multi_turn", "agent_loop", "developer_head"])
@pytest.mark.parametrize("thinking", [True, False], ids=["thinking", "chat"])
def test_without_generation_prompt_is_the_history_only(name: str, thinking: bool) -> None:
    case = CASES[name]
    full, history = ours(case, thinking, None), ours(case, thinking, None, add_generation_prompt=False)
    assert full == history + ASSISTANT + (THINK_START if thinking else THINK_END)


@pytest.mark.parametrize("thinking", [True, False], ids=["thinking", "chat"])
def test_continue_final_message_matches_reference_wo_eos(thinking: bool) -> None:
    messages = [user("Write a haiku"), asst("Autumn moon", "short poem")]
    expected_input = copy.deepcopy(messages)
    expected_input[-1]["wo_eos"] = True
    expected = reference().encode_messages(expected_input, thinking_mode="thinking" if thinking else "chat")
    assert encode_chat(messages, thinking=thinking, continue_final_message=True) == expected
    prefixed = copy.deepcopy(messages)
    prefixed[-1]["prefix"] = True
    assert encode_chat(prefixed, thinking=thinking) == expected
    assert expected.endswith("Autumn moon")


# --------------------------------------------------------------------------------------------------------
# Our mapping where the reference has no OpenAI spelling
# --------------------------------------------------------------------------------------------------------


def test_leading_system_messages_are_joined() -> None:
    out = encode_chat([system("One."), system("Two."), user("Q")])
    assert out == BOS + "One.\n\nTwo." + USER + "Q" + ASSISTANT + THINK_END


def test_late_system_message_becomes_user_text() -> None:
    out = encode_chat([user("Q"), asst("A"), system("Reminder: be brief.")], thinking=True)
    assert (
        out
        == BOS
        + USER
        + "Q"
        + ASSISTANT
        + THINK_END
        + "A"
        + EOS
        + USER
        + "Reminder: be brief."
        + ASSISTANT
        + (THINK_START)
    )
    merged = encode_chat([user("Q"), system("Reminder.")])
    assert merged == BOS + USER + "Q\n\nReminder." + ASSISTANT + THINK_END


def test_content_part_lists_are_joined() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert encode_chat([user(parts)]) == encode_chat([user("a\n\nb")])
    assert encode_chat([system(parts), user("x")]) == encode_chat([system("a\n\nb"), user("x")])


def test_argument_spellings_render_identically() -> None:
    """History must render the same whatever JSON spelling the client sends back (prefix-cache hits)."""
    args = {"query": "q", "filters": {"b": [1, 2], "a": {"x": None}}, "n": 1.5}
    spellings = [
        json.dumps(args),
        json.dumps(args, separators=(",", ":")),
        json.dumps(args, indent=2),
        json.dumps(args, ensure_ascii=True),
        json.dumps(json.dumps(args)),
        args,
    ]
    renders = {
        encode_chat([user("x"), asst("", None, [call("c1", "search", s)]), tool("c1", "r")], [SEARCH])
        for s in spellings
    }
    assert len(renders) == 1
    rendered = renders.pop()
    assert '<｜DSML｜parameter name="filters" string="false">{"b": [1, 2], "a": {"x": null}}</' in rendered
    assert rendered.index('name="query"') < rendered.index('name="filters"') < rendered.index('name="n"')


def test_empty_arguments_mean_no_parameters() -> None:
    def render(arguments: Any) -> str:
        return encode_chat(
            [user("x"), asst("", None, [call("c1", "bash", arguments)]), tool("c1", "r")], [BASH]
        )

    assert render("") == render("{}") == render({})
    assert '<｜DSML｜invoke name="bash">\n\n</｜DSML｜invoke>' in render("")


def test_unparsable_arguments_follow_reference() -> None:
    messages = [user("x"), asst("", None, [call("c1", "bash", "not json")]), tool("c1", "r")]
    expected = reference().encode_messages(reference_input({"messages": messages, "tools": [BASH]}), "chat")
    assert encode_chat(messages, [BASH]) == expected
    assert '<｜DSML｜parameter name="arguments" string="true">not json</' in expected


def test_null_tool_content_and_reasoning_alias() -> None:
    messages = [user("x"), asst("", None, [call("c1", "bash", {"command": "a"})]), tool("c1", None)]
    assert "<tool_result></tool_result>" in encode_chat(messages, [BASH])
    aliased = [user("Q"), {"role": "assistant", "content": "A", "reasoning": "R"}, user("Q2")]
    assert encode_chat(aliased, [BASH], thinking=True) == encode_chat(
        [user("Q"), asst("A", "R"), user("Q2")], [BASH], thinking=True
    )
    assert "R" + THINK_END + "A" + EOS in encode_chat(aliased, [BASH], thinking=True)


def test_response_format_json_object_adds_nothing() -> None:
    messages = [user("Q")]
    assert encode_chat(messages, response_format={"type": "json_object"}) == encode_chat(messages)
    assert encode_chat(messages, response_format={"type": "text"}) == encode_chat(messages)


# --------------------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------------------

BAD_REQUESTS: dict[str, tuple[dict[str, Any], str]] = {
    "empty": ({"messages": []}, "non-empty"),
    "unknown_role": ({"messages": [{"role": "robot", "content": "x"}]}, "unknown role 'robot'"),
    "missing_role": ({"messages": [{"content": "x"}]}, "unknown role None"),
    "tool_first": ({"messages": [tool("c1", "x")]}, "must follow an assistant message with tool_calls"),
    "tool_after_plain_assistant": (
        {"messages": [user("a"), asst("b"), tool("c1", "x")]},
        "must follow an assistant message with tool_calls",
    ),
    "tool_after_user": (
        {
            "messages": [
                user("a"),
                asst("", None, [call("c1", "bash", "{}")]),
                tool("c1", "r"),
                user("b"),
                tool("c1", "x"),
            ]
        },
        "messages[4]",
    ),
    "tool_missing_name": (
        {"messages": [user("a")], "tools": [{"type": "function", "function": {"description": "d"}}]},
        "tools[0]: function.name is missing",
    ),
    "tool_params_not_object": (
        {
            "messages": [user("a")],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}],
        },
        "parameters must be a JSON schema of type object",
    ),
    "tool_params_array": (
        {
            "messages": [user("a")],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}],
        },
        "type object",
    ),
    "tool_not_function": ({"messages": [user("a")], "tools": [{"type": "retrieval"}]}, "tools[0]"),
    "tool_without_definition": (
        {"messages": [user("a")], "tools": [{"type": "function"}]},
        "definition is missing",
    ),
    "duplicate_tools": ({"messages": [user("a")], "tools": [READ, READ]}, "duplicate function name"),
    "tool_name_with_quote": (
        {"messages": [user("a")], "tools": [{"type": "function", "function": {"name": 'a"b'}}]},
        "quote",
    ),
    "empty_developer": (
        {"messages": [{"role": "developer", "content": ""}, user("a")], "developer_as_system": False},
        "developer",
    ),
    "image_in_user": (
        {"messages": [user([{"type": "image_url", "image_url": {"url": "x"}}])]},
        "unsupported content part",
    ),
    "ends_with_assistant": ({"messages": [user("a"), asst("b")]}, "must end with a user or tool message"),
    "only_system": ({"messages": [system("s")]}, "must end with a user or tool message"),
    "call_without_name": (
        {
            "messages": [user("a"), asst("", None, [{"type": "function", "function": {"arguments": "{}"}}])],
            "add_generation_prompt": False,
        },
        "tool_calls[0]: function.name is missing",
    ),
    "bad_effort": ({"messages": [user("a")], "reasoning_effort": "extreme"}, "unknown reasoning_effort"),
    "numeric_effort_v4": ({"messages": [user("a")], "reasoning_effort": 60}, "V4.1 only"),
    "bad_response_format": (
        {"messages": [user("a")], "response_format": {"type": "json_schema"}},
        "response_format",
    ),
}


@pytest.mark.parametrize("name", sorted(BAD_REQUESTS))
def test_bad_requests_raise_chat_format_error(name: str) -> None:
    kwargs, message = BAD_REQUESTS[name]
    with pytest.raises(ChatFormatError, match=None) as err:
        encode_chat(**kwargs)
    assert message in str(err.value)
    assert isinstance(err.value, ValueError)


# --------------------------------------------------------------------------------------------------------
# Prefix stability across turns
# --------------------------------------------------------------------------------------------------------


def turns_of(messages: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Every request an agent would send: the history up to each user or tool message that is followed by
    an assistant reply (or ends the conversation)."""
    cuts = [
        i + 1
        for i, m in enumerate(messages)
        if m["role"] in ("user", "tool")
        and (i + 1 == len(messages) or messages[i + 1]["role"] == "assistant")
    ]
    return [messages[:c] for c in cuts]


@pytest.mark.parametrize(
    ("thinking", "tools"),
    [(True, TOOLS), (False, TOOLS), (False, None)],
    ids=["thinking+tools", "chat+tools", "chat"],
)
def test_each_turn_prompt_is_a_prefix_of_the_next(thinking: bool, tools: list[dict[str, Any]] | None) -> None:
    requests = turns_of(AGENT_LOOP)
    assert len(requests) == 5
    prompts = [encode_chat(r, tools, thinking, "max") for r in requests]
    tok = tokenizer()
    for before, after in itertools.pairwise(prompts):
        assert after.startswith(before)
        ids_before = tok.encode(before, add_special_tokens=False).ids
        ids_after = tok.encode(after, add_special_tokens=False).ids
        assert ids_after[: len(ids_before)] == ids_before  # prompts end on a special token: token prefix too


def test_thinking_without_tools_diverges_only_at_the_last_token() -> None:
    """V4 drops reasoning before the last user message when no tools are given: turn k's trailing <think>
    becomes </think> in turn k+1; everything before it is shared."""
    requests = turns_of(AGENT_LOOP)
    prompts = [encode_chat(r, None, True) for r in requests]
    tok = tokenizer()
    for before, after in itertools.pairwise(prompts):
        assert before.endswith(ASSISTANT + THINK_START) and not after.startswith(before)
        shared = before[: -len(THINK_START)]
        assert after.startswith(shared + THINK_END)
        ids_before = tok.encode(before, add_special_tokens=False).ids
        ids_after = tok.encode(after, add_special_tokens=False).ids
        assert ids_after[: len(ids_before) - 1] == ids_before[:-1]


def test_v4_developer_message_vanishes_in_thinking_without_tools() -> None:
    """The reference drops a V4 developer message once any user message follows it (first turn included),
    unless tools are given; OpenAI's developer role (our default) keeps it as the system prompt."""
    dev = [{"role": "developer", "content": "Dev rules."}, user("Q1")]
    assert "Dev rules." not in encode_chat(dev, thinking=True, developer_as_system=False)
    assert "Dev rules." in encode_chat(dev, [BASH], thinking=True, developer_as_system=False)
    assert "Dev rules." in encode_chat(dev, thinking=False, developer_as_system=False)
    assert encode_chat(dev, thinking=True) == encode_chat([system("Dev rules."), user("Q1")], thinking=True)


def test_generated_turn_reappears_verbatim_in_the_next_prompt() -> None:
    """prompt + forced prefix + model output, parsed and sent back by the client, renders as exactly that
    text (so the next turn reuses the decode-time KV as well as the prompt's)."""
    history = [system("Agent."), user("List files then read a.py")]
    completion = (
        "I will list and read.</think>Working on it.\n\n<｜DSML｜tool_calls>\n"
        '<｜DSML｜invoke name="bash">\n<｜DSML｜parameter name="command" string="true">ls -la</｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="timeout" string="false">10</｜DSML｜parameter>\n</｜DSML｜invoke>\n'
        '<｜DSML｜invoke name="read_file">\n<｜DSML｜parameter name="path" string="true">a.py</｜DSML｜parameter>\n'
        "</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
    )
    prompt = encode_chat(history, TOOLS, thinking=True)
    message = parse_completion(completion, thinking=True).to_message()
    results = [tool(c["id"], "out") for c in message["tool_calls"]]
    assert encode_chat(history + [message] + results, TOOLS, thinking=True).startswith(
        prompt + completion + EOS
    )

    named = {"type": "function", "function": {"name": "read_file"}}
    forced = forced_prefix(named, TOOLS, thinking=True)
    output = (
        '<｜DSML｜parameter name="path" string="true">b.py</｜DSML｜parameter>\n'
        "</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
    )
    parser = OutputParser(thinking=True)
    message = collect(parser.feed(forced) + parser.feed(output) + parser.finish()).to_message()
    assert message["tool_calls"][0]["function"] == {"name": "read_file", "arguments": '{"path": "b.py"}'}
    follow_up = history + [message, tool(message["tool_calls"][0]["id"], "x")]
    assert encode_chat(follow_up, TOOLS, thinking=True).startswith(prompt + forced + output + EOS)


# --------------------------------------------------------------------------------------------------------
# tool_choice and V4.1 effort
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("thinking", [True, False], ids=["thinking", "chat"])
def test_forced_prefix(thinking: bool) -> None:
    close = THINK_END if thinking else ""
    assert forced_prefix("auto", TOOLS, thinking) == forced_prefix(None, TOOLS, thinking) == ""
    assert forced_prefix("none", TOOLS, thinking) == ""
    assert forced_prefix("required", TOOLS, thinking) == close + "\n\n<｜DSML｜tool_calls>\n"
    named = forced_prefix({"type": "function", "function": {"name": "bash"}}, TOOLS, thinking)
    assert named == close + '\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="bash">\n'
    assert forced_prefix({"type": "function", "name": "bash"}, TOOLS, thinking) == named


def test_tool_choice_errors_and_none() -> None:
    with pytest.raises(ChatFormatError, match="not among the tools"):
        forced_prefix({"type": "function", "function": {"name": "nope"}}, TOOLS, False)
    with pytest.raises(ChatFormatError, match="needs at least one tool"):
        forced_prefix("required", None, False)
    with pytest.raises(ChatFormatError, match="unknown tool_choice"):
        forced_prefix("sometimes", TOOLS, False)
    assert tools_for_prompt("none", TOOLS) is None
    assert tools_for_prompt("auto", TOOLS) == TOOLS
    assert "## Tools" not in encode_chat([user("x")], tools_for_prompt("none", TOOLS))


def test_v41_reasoning_budget() -> None:
    assert [reasoning_budget(e) for e in ("low", "high", "max", None, 1, 100, 42)] == [
        50,
        75,
        100,
        75,
        1,
        100,
        42,
    ]
    for bad in (0, 101, True, "extreme", 1.5):
        with pytest.raises(ValueError):
            reasoning_budget(bad)  # type: ignore[arg-type]
    with pytest.raises(ChatFormatError, match="within 1-100"):
        encode_chat([user("x")], thinking=True, reasoning_effort=0, family="v41")
    out = encode_chat([user("x")], thinking=True, reasoning_effort=42, family="v41")
    assert out.startswith(BOS + "Reasoning Effort: 42 (range 1-100,")
    assert "Reasoning Effort: 75 " in encode_chat([user("x")], thinking=True, family="v41")
    assert "Reasoning Effort" not in encode_chat(
        [user("x")], thinking=False, reasoning_effort=42, family="v41"
    )
