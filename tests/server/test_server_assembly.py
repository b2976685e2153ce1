"""Response assembly without a model: scripted DeepSeek-V4 output -> OpenAI chunks / message, Anthropic events."""

from __future__ import annotations

import itertools
import json

import pytest

from v4serve.server.anthropic_events import MessageAssembler, parse_tool_input, stop_reason
from v4serve.server.openai_chat import ChatChoice, ChatPlan, delta_for, sibling_index, usage
from v4serve.server.parsers import ToolCallStart
from v4serve.tokenizer import Tokenizer

D = "｜DSML｜"
EOS = "<｜end▁of▁sentence｜>"
MARKUP = ("｜DSML｜", "<｜", "</｜", "</think>", "<think>", EOS)


def call(name: str, **params: object) -> str:
    body = "\n".join(
        f'<{D}parameter name="{k}" string="{"true" if isinstance(v, str) else "false"}">'
        f'{v if isinstance(v, str) else json.dumps(v)}</{D}parameter>' for k, v in params.items())
    return f'<{D}invoke name="{name}">\n{body}\n</{D}invoke>'


def block(*calls: str) -> str:
    return f"\n\n<{D}tool_calls>\n" + "\n".join(calls) + f"\n</{D}tool_calls>"


THINK_AND_CALLS = ("Let me look at the file.</think>I will read it." +
                   block(call("read_file", path="src/a.py", limit=20), call("grep", pattern="<think>|x")) + EOS)


def plan(thinking: bool = True, prefix: str = "", report: bool = True, single: bool = False) -> ChatPlan:
    return ChatPlan([1, 2, 3], thinking, prefix, report, single)


def ids() -> object:
    n = itertools.count()
    return lambda: f"call_{next(n)}"


def run_stream(choice: ChatChoice, pieces: list[str], reason: str = "stop") -> list[dict]:
    deltas = [delta_for(e) for e in choice.start()]
    for p in pieces:
        deltas += [delta_for(e) for e in choice.feed(p, [0])]
    deltas += [delta_for(e) for e in choice.finish(reason)]
    return [d for d in deltas if d is not None]


def merge_deltas(deltas: list[dict]) -> dict:
    """What an OpenAI client accumulates from stream deltas."""
    out = {"content": "", "reasoning_content": "", "tool_calls": {}}
    for d in deltas:
        out["content"] += d.get("content") or ""
        out["reasoning_content"] += d.get("reasoning_content") or ""
        for tc in d.get("tool_calls", []):
            slot = out["tool_calls"].setdefault(tc["index"], {"id": None, "name": None, "arguments": ""})
            if "id" in tc:
                assert slot["id"] is None, "a call's id is sent once"
                slot["id"], slot["name"] = tc["id"], tc["function"]["name"]
            slot["arguments"] += tc["function"].get("arguments", "")
    return out


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_stream_deltas_match_message_at_any_chunking(size: int) -> None:
    pieces = [THINK_AND_CALLS[i:i + size] for i in range(0, len(THINK_AND_CALLS), size)]
    streamed = ChatChoice(0, plan(), id_factory=ids())
    merged = merge_deltas(run_stream(streamed, pieces))
    assert merged["reasoning_content"] == "Let me look at the file."
    assert merged["content"] == "I will read it."
    calls = [merged["tool_calls"][i] for i in sorted(merged["tool_calls"])]
    assert [c["name"] for c in calls] == ["read_file", "grep"]
    assert json.loads(calls[0]["arguments"]) == {"path": "src/a.py", "limit": 20}
    assert json.loads(calls[1]["arguments"]) == {"pattern": "<think>|x"}  # data, not markup
    for text in [merged["content"], merged["reasoning_content"], calls[0]["arguments"]]:
        assert not any(m in text for m in MARKUP)
    assert streamed.finish_reason == "tool_calls"
    message = streamed.message()
    assert message["content"] == "I will read it." and message["reasoning_content"] == "Let me look at the file."
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["read_file", "grep"]
    assert [c["id"] for c in message["tool_calls"]] == ["call_0", "call_1"]


def test_arguments_stream_before_the_call_closes() -> None:
    choice = ChatChoice(0, plan(thinking=False), id_factory=ids())
    text = block(call("write_file", path="a.txt", content="x" * 200))
    cut = text.index("x" * 200) + 100  # halfway through a long string argument
    merged = merge_deltas(run_stream_partial(choice, text[:cut]))
    assert merged["tool_calls"][0]["name"] == "write_file"
    assert "x" * 50 in merged["tool_calls"][0]["arguments"]


def run_stream_partial(choice: ChatChoice, text: str) -> list[dict]:
    return [d for d in (delta_for(e) for e in choice.feed(text, [0])) if d is not None]


def test_forced_named_function_prefix_starts_the_call() -> None:
    prefix = f"</think>\n\n<{D}tool_calls>\n<{D}invoke name=\"get_weather\">\n"
    choice = ChatChoice(0, plan(thinking=True, prefix=prefix), id_factory=ids())
    first = choice.start()
    assert isinstance(first[0], ToolCallStart) and first[0].name == "get_weather"
    merged = merge_deltas([delta_for(e) for e in first if delta_for(e)] + run_stream(
        choice, [f'<{D}parameter name="city" string="true">Paris</{D}parameter>\n</{D}invoke>\n</{D}tool_calls>']))
    assert json.loads(merged["tool_calls"][0]["arguments"]) == {"city": "Paris"}
    assert merged["reasoning_content"] == ""
    assert choice.finish_reason == "tool_calls"
    choice.token_ids = [5, 128822, 7]
    assert choice.reasoning_tokens == 0  # the prefix closed the reasoning


def test_forced_call_cut_by_length_is_still_a_call() -> None:
    prefix = f"\n\n<{D}tool_calls>\n<{D}invoke name=\"f\">\n"
    choice = ChatChoice(0, plan(thinking=False, prefix=prefix), id_factory=ids())
    deltas = run_stream(choice, [f'<{D}parameter name="q" string="true">abc'], reason="length")
    merged = merge_deltas(deltas)
    assert merged["tool_calls"][0]["name"] == "f"
    assert json.loads(merged["tool_calls"][0]["arguments"]) == {"q": "abc"}
    assert choice.finish_reason == "length"


def test_tool_choice_none_hides_calls_and_markup() -> None:
    choice = ChatChoice(0, plan(thinking=False, report=False), id_factory=ids())
    merged = merge_deltas(run_stream(choice, ["Answer." + block(call("f", a=1)) + EOS]))
    assert merged["tool_calls"] == {} and merged["content"] == "Answer."
    assert choice.finish_reason == "stop" and "tool_calls" not in choice.message()


def test_parallel_tool_calls_false_keeps_the_first_call() -> None:
    choice = ChatChoice(0, plan(thinking=False, single=True), id_factory=ids())
    merged = merge_deltas(run_stream(choice, [block(call("a", x=1), call("b", y=2))]))
    assert [c["name"] for c in merged["tool_calls"].values()] == ["a"]
    assert len(choice.message()["tool_calls"]) == 1


def test_usage_and_reasoning_tokens() -> None:
    tok = Tokenizer.from_pretrained(None)
    text = "Thinking hard.</think>Done."
    token_ids = tok.encode(text)
    choice = ChatChoice(0, plan(thinking=True))
    choice.feed(text, token_ids)
    choice.finish("stop")
    choice.num_output_tokens, choice.num_cached_tokens = len(token_ids), 64
    u = usage(100, [choice])
    assert u["prompt_tokens"] == 100 and u["completion_tokens"] == len(token_ids)
    assert u["total_tokens"] == 100 + len(token_ids)
    assert u["prompt_tokens_details"] == {"cached_tokens": 64}
    assert u["completion_tokens_details"]["reasoning_tokens"] == token_ids.index(tok.think_end_id)
    assert sibling_index("chatcmpl-x#3") == 3 and sibling_index("chatcmpl-x") == 0


def anthropic_stream(text: str, prefix: str = "", thinking: bool = True, reason: str = "stop"):
    choice = ChatChoice(0, plan(thinking=thinking, prefix=prefix), id_factory=ids())
    out = MessageAssembler("msg_1", "m", 100)
    events = []
    for i in range(0, len(text), 3):
        events += out.events(choice, choice.feed(text[i:i + 3], [0]))
    events += out.events(choice, choice.finish(reason))
    events += out.finish(choice)
    return choice, out, events


def test_anthropic_events_for_thinking_text_and_tools() -> None:
    choice, out, events = anthropic_stream(THINK_AND_CALLS)
    names = [n for n, _ in events]
    assert names[-2:] == ["message_delta", "message_stop"]
    starts = [d["content_block"] for n, d in events if n == "content_block_start"]
    assert [b["type"] for b in starts] == ["thinking", "text", "tool_use", "tool_use"]
    assert [b.get("name") for b in starts[2:]] == ["read_file", "grep"]
    # every block opened is closed, in order, and deltas go to the open block
    open_index = None
    for name, data in events:
        if name == "content_block_start":
            assert open_index is None
            open_index = data["index"]
        elif name == "content_block_delta":
            assert data["index"] == open_index
        elif name == "content_block_stop":
            assert data["index"] == open_index
            open_index = None
    assert open_index is None
    args = "".join(d["delta"]["partial_json"] for n, d in events
                   if n == "content_block_delta" and d["delta"]["type"] == "input_json_delta" and d["index"] == 2)
    assert json.loads(args) == {"path": "src/a.py", "limit": 20}
    final = events[-2][1]
    assert final["delta"]["stop_reason"] == "tool_use"
    body = out.message(choice)
    assert [b["type"] for b in body["content"]] == ["thinking", "text", "tool_use", "tool_use"]
    assert body["content"][2]["input"] == {"path": "src/a.py", "limit": 20}
    assert body["stop_reason"] == "tool_use"


def test_anthropic_usage_and_stop_reasons() -> None:
    choice, out, _ = anthropic_stream("Hello" + EOS, thinking=False)
    choice.num_output_tokens, choice.num_cached_tokens = 2, 64
    assert out.usage(choice) == {"input_tokens": 36, "output_tokens": 2, "cache_read_input_tokens": 64,
                                 "cache_creation_input_tokens": 0}
    assert stop_reason(choice) == ("end_turn", None)
    choice.engine_reason = "length"
    assert stop_reason(choice) == ("max_tokens", None)
    choice.engine_reason, choice.stop_reason = "stop", "###"
    assert stop_reason(choice) == ("stop_sequence", "###")
    assert parse_tool_input('{"a": 1}') == {"a": 1} and parse_tool_input('{"a": ') == {}
