"""OutputParser / parse_completion: golden cases split at every boundary and token by token with the real
tokenizer, recovery from malformed output, and agreement with DeepSeek's reference parser."""

from __future__ import annotations

import itertools
import json
import random
import time
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from v4serve.server.parsers import (
    ContentDelta,
    Event,
    OutputParser,
    ParsedCompletion,
    ReasoningDelta,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallStart,
    collect,
    parse_completion,
)
from v4serve.server.reasoning import count_reasoning_tokens

EOS = "<｜end▁of▁sentence｜>"
D = "｜DSML｜"
MARKUP = ("｜DSML｜", "<｜", "</｜", EOS, "<｜begin▁of▁sentence｜>")
THINK_TAGS = ("<think>", "</think>")  # data inside argument values, markup elsewhere


from dsv4_reference import reference, tokenizer

# --------------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------------


def par(name: str, value: str, string: bool = True) -> str:
    return f'<{D}parameter name="{name}" string="{"true" if string else "false"}">{value}</{D}parameter>'


def inv(name: str, *params: str) -> str:
    return f'<{D}invoke name="{name}">\n' + "\n".join(params) + f"\n</{D}invoke>"


def block(*invokes: str) -> str:
    return f"\n\n<{D}tool_calls>\n" + "\n".join(invokes) + f"\n</{D}tool_calls>"


def counter_ids() -> Callable[[], str]:
    numbers = itertools.count()
    return lambda: f"call_{next(numbers)}"


def stream(chunks: Iterable[str], thinking: bool, **kw: Any) -> tuple[ParsedCompletion, list[Event]]:
    parser = OutputParser(thinking, id_factory=counter_ids(), **kw)
    events: list[Event] = []
    for chunk in chunks:
        events += parser.feed(chunk)
    events += parser.finish()
    return collect(events), events


def check_events(events: list[Event]) -> None:
    """Stream invariants: no markup in any text, calls well bracketed, arguments valid JSON objects."""
    started: list[int] = []
    ended: set[int] = set()
    args: dict[int, str] = {}
    for ev in events:
        if isinstance(ev, ReasoningDelta | ContentDelta | ToolCallArgsDelta):
            assert ev.text, "empty delta"
            assert not any(m in ev.text for m in MARKUP), f"markup leaked: {ev!r}"
            if not isinstance(ev, ToolCallArgsDelta):
                assert not any(m in ev.text for m in THINK_TAGS), f"think tag leaked: {ev!r}"
        if isinstance(ev, ToolCallStart):
            assert ev.index == len(started) and ev.name
            started.append(ev.index)
        elif isinstance(ev, ToolCallArgsDelta):
            assert ev.index in started and ev.index not in ended
            args[ev.index] = args.get(ev.index, "") + ev.text
        elif isinstance(ev, ToolCallEnd):
            assert ev.index in started and ev.index not in ended
            ended.add(ev.index)
    assert ended == set(started)
    for index in started:
        assert isinstance(json.loads(args[index]), dict)


def summary(parsed: ParsedCompletion) -> tuple[str, str, list[tuple[str, str, bool]]]:
    return parsed.reasoning, parsed.content, [(c.name, c.arguments, c.complete) for c in parsed.tool_calls]


def token_deltas(text: str) -> list[str]:
    """The text as an engine streams it: one decoded delta per generated token (incomplete UTF-8 held)."""
    tok = tokenizer()
    ids = tok.encode(text, add_special_tokens=False).ids
    deltas, shown = [], ""
    for i in range(1, len(ids) + 1):
        decoded = tok.decode(ids[:i], skip_special_tokens=False)
        if decoded.endswith("\ufffd"):
            continue
        assert decoded.startswith(shown)
        deltas.append(decoded[len(shown) :])
        shown = decoded
    assert shown == text
    return deltas


# --------------------------------------------------------------------------------------------------------
# Golden cases: (thinking, completion text, (reasoning, content, [(name, arguments, complete)]))
# --------------------------------------------------------------------------------------------------------

WRITE_VALUE = '<div class="a">if a < b && c > d</div>\n</thinking> ｜x｜ "q" \\ end'
ESCAPES = "echo \"a\\b\"\n\tprintf '%s' \u0001 \u2028"

GOLDEN: dict[str, tuple[bool, str, tuple[str, str, list[tuple[str, str, bool]]]]] = {
    "reasoning_then_content": (
        True,
        "Let me think about 2+2.</think>It is 4." + EOS,
        ("Let me think about 2+2.", "It is 4.", []),
    ),
    "chat_plain": (
        False,
        "Hello there!\n\nHow can I help?" + EOS,
        ("", "Hello there!\n\nHow can I help?", []),
    ),
    "single_call": (
        True,
        "Need to read.</think>" + block(inv("read_file", par("path", "src/main.py"))) + EOS,
        ("Need to read.", "", [("read_file", '{"path": "src/main.py"}', True)]),
    ),
    "content_then_parallel_calls": (
        True,
        "Plan.</think>Reading three files."
        + block(
            inv("read_file", par("path", "a.py")),
            inv("read_file", par("path", "b.py"), par("limit", "100", False)),
            inv("bash", par("command", "ls -la | head")),
        )
        + EOS,
        (
            "Plan.",
            "Reading three files.",
            [
                ("read_file", '{"path": "a.py"}', True),
                ("read_file", '{"path": "b.py", "limit": 100}', True),
                ("bash", '{"command": "ls -la | head"}', True),
            ],
        ),
    ),
    "json_values": (
        False,
        block(
            inv(
                "search",
                par("query", "q"),
                par("n", "42", False),
                par("x", "-1.5e3", False),
                par("ok", "true", False),
                par("none", "null", False),
                par("obj", '{"a": [1, {"b": null}], "c": "d"}', False),
                par("arr", "[1,2,3]", False),
            )
        ),
        (
            "",
            "",
            [
                (
                    "search",
                    (
                        '{"query": "q", "n": 42, "x": -1.5e3, "ok": true, "none": null, '
                        '"obj": {"a": [1, {"b": null}], "c": "d"}, "arr": [1,2,3]}'
                    ),
                    True,
                )
            ],
        ),
    ),
    "invalid_json_values_become_strings": (
        False,
        block(
            inv(
                "f",
                par("a", "[1, 2", False),
                par("b", "NaN", False),
                par("c", "", False),
                par("d", "hello world", False),
            )
        ),
        ("", "", [("f", '{"a": "[1, 2", "b": "NaN", "c": "", "d": "hello world"}', True)]),
    ),
    "missing_think_end": (
        True,
        "I will call the tool now." + block(inv("bash", par("command", "pytest"))) + EOS,
        ("I will call the tool now.", "", [("bash", '{"command": "pytest"}', True)]),
    ),
    "missing_think_end_single_newline": (
        True,
        f"Reasoning.\n<{D}tool_calls>\n" + inv("bash", par("command", "id")) + f"\n</{D}tool_calls>",
        ("Reasoning.", "", [("bash", '{"command": "id"}', True)]),
    ),
    "chat_content_then_call": (
        False,
        "Sure, running it." + block(inv("bash", par("command", "make test"))) + EOS,
        ("", "Sure, running it.", [("bash", '{"command": "make test"}', True)]),
    ),
    "markup_lookalikes_in_content": (
        False,
        "Use a < b and c > d, <div>x</div>, </thinking>, <think-ish> and ｜pipes｜ or <|fake|>." + EOS,
        ("", "Use a < b and c > d, <div>x</div>, </thinking>, <think-ish> and ｜pipes｜ or <|fake|>.", []),
    ),
    "markup_lookalikes_in_string_value": (
        False,
        block(inv("write", par("path", "x.html"), par("content", WRITE_VALUE))),
        (
            "",
            "",
            [("write", json.dumps({"path": "x.html", "content": WRITE_VALUE}, ensure_ascii=False), True)],
        ),
    ),
    "escapes_in_string_value": (
        False,
        block(inv("bash", par("command", ESCAPES))),
        ("", "", [("bash", json.dumps({"command": ESCAPES}, ensure_ascii=False), True)]),
    ),
    "unicode": (
        True,
        "思考中…🤔</think>答案是 42 ✅" + block(inv("search", par("query", "東京 天気 ☀️ naïve café"))) + EOS,
        ("思考中…🤔", "答案是 42 ✅", [("search", '{"query": "東京 天気 ☀️ naïve café"}', True)]),
    ),
    "text_after_block": (
        False,
        "Checking." + block(inv("bash", par("command", "ls"))) + "\n\nDone, see above." + EOS,
        ("", "Checking.\n\nDone, see above.", [("bash", '{"command": "ls"}', True)]),
    ),
    "only_text_after_block": (
        False,
        block(inv("bash", par("command", "ls"))) + "\n\nDone." + EOS,
        ("", "Done.", [("bash", '{"command": "ls"}', True)]),
    ),
    "whitespace_after_block": (
        False,
        "Hi." + block(inv("f")) + "\n \n" + EOS,
        ("", "Hi.", [("f", "{}", True)]),
    ),
    "two_blocks": (
        False,
        block(inv("a", par("x", "1"))) + "\n\n" + block(inv("b", par("y", "2"))),
        ("", "", [("a", '{"x": "1"}', True), ("b", '{"y": "2"}', True)]),
    ),
    "truncated_in_string_value": (
        False,
        (
            f'OK.\n\n<{D}tool_calls>\n<{D}invoke name="write">\n'
            f'<{D}parameter name="content" string="true">partial te'
        ),
        ("", "OK.", [("write", '{"content": "partial te"}', False)]),
    ),
    "truncated_in_json_value": (
        False,
        f'\n\n<{D}tool_calls>\n<{D}invoke name="f">\n<{D}parameter name="n" string="false">[1, 2',
        ("", "", [("f", '{"n": "[1, 2"}', False)]),
    ),
    "truncated_in_tag": (False, f'OK.\n\n<{D}tool_calls>\n<{D}invoke name="wri', ("", "OK.", [])),
    "truncated_after_invoke_open": (
        False,
        f'\n\n<{D}tool_calls>\n<{D}invoke name="ls">\n',
        ("", "", [("ls", "{}", False)]),
    ),
    "truncated_special_token": (False, "Done.<｜end▁of", ("", "Done.", [])),
    "ends_with_lt": (False, "a <", ("", "a <", [])),
    "garbage_in_block": (
        False,
        f"Hi.\n\n<{D}tool_calls>\nI changed my mind." + EOS,
        ("", "Hi.I changed my mind.", []),
    ),
    "garbage_inside_invoke": (
        False,
        f'\n\n<{D}tool_calls>\n<{D}invoke name="f">\n' + par("a", "1") + "\noops" + EOS,
        ("", "oops", [("f", '{"a": "1"}', False)]),
    ),
    "malformed_invoke_tag": (
        False,
        f'\n\n<{D}tool_calls>\n<{D}invoke nme="f">\n' + par("a", "v") + f"\n</{D}invoke>\n</{D}tool_calls>",
        ("", "v\n\n", []),
    ),
    "missing_closing_tags": (
        False,
        f'\n\n<{D}tool_calls>\n<{D}invoke name="a">\n<{D}parameter name="x" string="true">1'
        f'<{D}parameter name="y" string="false">2\n<{D}invoke name="b">\n'
        f'<{D}parameter name="z" string="true">3'
        f"</{D}tool_calls>" + EOS,
        ("", "", [("a", '{"x": "1", "y": 2\n}', True), ("b", '{"z": "3"}', True)]),
    ),
    "invoke_without_block": (
        False,
        "Running.\n\n" + inv("bash", par("command", "ls")) + EOS,
        ("", "Running.", [("bash", '{"command": "ls"}', True)]),
    ),
    "stray_markers": (False, "Hello<think> world</think>!" + EOS, ("", "Hello world!", [])),
    "think_tags_in_value_are_data": (
        False,
        block(inv("f", par("a", "x</think>y<think>"))),
        ("", "", [("f", '{"a": "x</think>y<think>"}', True)]),
    ),
    "block_inside_reasoning_then_think_end": (
        True,
        "Plan." + block(inv("f", par("a", "1"))) + "\nMore thoughts.</think>Final answer." + EOS,
        ("Plan.", "More thoughts.Final answer.", [("f", '{"a": "1"}', True)]),
    ),
    "duplicate_params": (
        False,
        block(inv("f", par("a", "1"), par("a", "2"))),
        ("", "", [("f", '{"a": "1", "a": "2"}', True)]),
    ),
    "missing_string_attribute": (
        False,
        block(
            f'<{D}invoke name="f">\n<{D}parameter name="n">5</{D}parameter>\n'
            f'<{D}parameter name="s">hi</{D}parameter>\n</{D}invoke>'
        ),
        ("", "", [("f", '{"n": 5, "s": "hi"}', True)]),
    ),
    "empty": (True, "", ("", "", [])),
    "only_eos": (False, EOS, ("", "", [])),
    "reasoning_truncated": (True, "Still thinking about", ("Still thinking about", "", [])),
    "content_trailing_newlines": (False, "Line\n\n" + EOS, ("", "Line\n\n", [])),
    "three_newlines_before_block": (
        False,
        f"a\n\n\n<{D}tool_calls>\n" + inv("f") + f"\n</{D}tool_calls>",
        ("", "a\n", [("f", "{}", True)]),
    ),
    "bare_dsml_token": (False, f"x{D}y", ("", "xy", [])),
    "dsml_prefix_without_tag": (False, f"a <{D}" + "z" * 600 + ">", ("", "a " + "z" * 600 + ">", [])),
}


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_whole(name: str) -> None:
    thinking, text, expected = GOLDEN[name]
    parsed, events = stream([text], thinking)
    check_events(events)
    assert summary(parsed) == expected
    assert summary(parse_completion(text, thinking)) == expected


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_every_split_point(name: str) -> None:
    thinking, text, expected = GOLDEN[name]
    for cut in range(1, len(text)):
        parsed, events = stream([text[:cut], text[cut:]], thinking)
        check_events(events)
        assert summary(parsed) == expected, f"split at {cut}: {text[:cut]!r} | {text[cut:]!r}"
    parsed, events = stream(list(text), thinking)  # every boundary at once
    check_events(events)
    assert summary(parsed) == expected


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_token_by_token(name: str) -> None:
    thinking, text, expected = GOLDEN[name]
    parsed, events = stream(token_deltas(text), thinking)
    check_events(events)
    assert summary(parsed) == expected


def test_golden_random_chunkings() -> None:
    rng = random.Random(7)
    for thinking, text, expected in GOLDEN.values():
        for _ in range(20):
            cuts = (
                sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 6))))
                if len(text) > 1
                else []
            )
            chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
            parsed, events = stream(chunks, thinking)
            check_events(events)
            assert summary(parsed) == expected


def test_golden_agrees_with_reference_where_it_parses() -> None:
    """Wherever the reference accepts a golden case it gives our result, except for string="false" values
    that are not JSON: the reference pastes them raw (invalid JSON), we make them JSON strings."""
    agreed = []
    for name, (thinking, text, expected) in sorted(GOLDEN.items()):
        try:
            ref = reference().parse_message_from_completion_text(text, "thinking" if thinking else "chat")
        except (AssertionError, ValueError):
            continue
        ref_calls = [(c["function"]["name"], c["function"]["arguments"]) for c in ref["tool_calls"]]
        if name == "invalid_json_values_become_strings":
            with pytest.raises(ValueError):
                json.loads(ref_calls[0][1])
            continue
        reasoning, content, calls = expected  # the reference has no notion of a call cut short
        assert (ref["reasoning_content"], ref["content"], ref_calls) == (
            reasoning,
            content,
            [(n, a) for n, a, _ in calls],
        ), name
        agreed.append(name)
    assert len(agreed) >= 12, agreed


# --------------------------------------------------------------------------------------------------------
# Random corpus rendered by the reference encoder
# --------------------------------------------------------------------------------------------------------

ALPHABET = list("abcdefghij ABC 0123456789 .,;:!?-_/\\\"'`()[]{}<>&=+*#@$%^~|\n\t") + list("éü中文日本🎉｜—")


def random_text(rng: random.Random, max_len: int = 40) -> str:
    return plain("".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, max_len))))


def plain(text: str) -> str:
    """ "<｜" and "</｜" open special tokens and tags: plain text does not hold them."""
    return text.replace("<｜", "< ｜").replace("</｜", "</ ｜")


def random_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.choice(["str", "str", "int", "float", "bool", "null", "list", "dict"][: 8 if depth < 2 else 6])
    if kind == "str":
        return random_text(rng)
    if kind == "int":
        return rng.randint(-(10**6), 10**6)
    if kind == "float":
        return rng.choice([0.5, -2.25, 1e-7, 3.14159])
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "list":
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {f"k{i}": random_value(rng, depth + 1) for i in range(rng.randint(0, 3))}


def random_message(rng: random.Random, thinking: bool) -> dict[str, Any]:
    calls = [
        {
            "type": "function",
            "function": {
                "name": rng.choice(["bash", "read_file", "search", "edit"]),
                "arguments": json.dumps(
                    {f"p{j}": random_value(rng) for j in range(rng.randint(1, 4))}, ensure_ascii=False
                ),
            },
        }
        for _ in range(rng.choice([0, 1, 1, 2, 3]))
    ]
    message: dict[str, Any] = {"role": "assistant", "content": random_text(rng, 60)}
    if thinking:
        message["reasoning_content"] = random_text(rng, 80)
    if calls:
        message["tool_calls"] = calls
    return message


def reference_completions(count: int) -> list[tuple[bool, str, dict[str, Any]]]:
    """(thinking, completion text as the model would write it, the message it encodes)."""
    rng = random.Random(1234)
    out = []
    for i in range(count):
        thinking = i % 2 == 0
        mode = "thinking" if thinking else "chat"
        message = random_message(rng, thinking)
        prompt = reference().encode_messages([{"role": "user", "content": "q"}], mode)
        full = reference().encode_messages([{"role": "user", "content": "q"}, message], mode)
        assert full.startswith(prompt)
        out.append((thinking, full[len(prompt) :], message))
    return out


CORPUS = reference_completions(60)


def test_corpus_matches_reference_parser_and_round_trips() -> None:
    for thinking, text, message in CORPUS:
        ref = reference().parse_message_from_completion_text(text, "thinking" if thinking else "chat")
        ours = parse_completion(text, thinking)
        assert (ours.reasoning, ours.content) == (ref["reasoning_content"], ref["content"])
        assert [(c.name, c.arguments) for c in ours.tool_calls] == [
            (c["function"]["name"], c["function"]["arguments"]) for c in ref["tool_calls"]
        ]
        assert ours.content == message["content"] and ours.reasoning == message.get("reasoning_content", "")
        for got, sent in zip(ours.tool_calls, message.get("tool_calls", []), strict=True):
            assert got.complete and json.loads(got.arguments) == json.loads(sent["function"]["arguments"])


def test_corpus_streamed_token_by_token_and_in_random_chunks() -> None:
    rng = random.Random(99)
    for thinking, text, _ in CORPUS:
        whole = summary(parse_completion(text, thinking))
        parsed, events = stream(token_deltas(text), thinking)
        check_events(events)
        assert summary(parsed) == whole
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, 8)))
        parsed, events = stream([text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])], thinking)
        check_events(events)
        assert summary(parsed) == whole


def test_corpus_every_split_point_sample() -> None:
    for thinking, text, _ in CORPUS[:6]:
        whole = summary(parse_completion(text, thinking))
        for cut in range(1, len(text)):
            assert summary(stream([text[:cut], text[cut:]], thinking)[0]) == whole


# --------------------------------------------------------------------------------------------------------
# Streaming behaviour
# --------------------------------------------------------------------------------------------------------


def test_long_string_argument_streams_as_it_arrives() -> None:
    rng = random.Random(5)
    value = plain("".join(rng.choice(ALPHABET) for _ in range(200_000)))
    text = "Writing.</think>" + block(inv("write", par("path", "big.txt"), par("content", value))) + EOS
    parser = OutputParser(True, id_factory=counter_ids())
    events: list[Event] = []
    streamed_before_close = 0
    pos = 0
    value_end = text.index(value) + len(value)
    while pos < len(text):
        step = rng.randint(1, 3000)
        new = parser.feed(text[pos : pos + step])
        pos += step
        if pos < value_end:
            streamed_before_close += sum(len(e.text) for e in new if isinstance(e, ToolCallArgsDelta))
        events += new
    events += parser.finish()
    check_events(events)
    parsed = collect(events)
    assert json.loads(parsed.tool_calls[0].arguments) == {"path": "big.txt", "content": value}
    assert streamed_before_close > 150_000  # not buffered until </parameter>


def test_large_markup_like_value_in_one_chunk_is_linear() -> None:
    """An HTML file written in one go: thousands of "<" inside a value must not make parsing quadratic."""
    page = "<html>" + "<div class='row'><span>a < b</span></div>\n" * 8000 + "</html>"
    text = block(inv("write", par("path", "index.html"), par("content", page)))
    started = time.perf_counter()
    parsed = parse_completion(text, False)
    assert time.perf_counter() - started < 2.0
    assert json.loads(parsed.tool_calls[0].arguments)["content"] == page


def test_long_json_argument_and_char_by_char_feeding() -> None:
    items = [{"id": i, "tags": ["x", "y"], "ok": i % 2 == 0} for i in range(3000)]
    value = json.dumps(items)
    text = block(inv("bulk", par("items", value, string=False), par("note", "é<" * 2000)))
    parsed, events = stream(list(text), False)
    check_events(events)
    assert json.loads(parsed.tool_calls[0].arguments) == {"items": items, "note": "é<" * 2000}


def test_events_order_and_indexes_for_parallel_calls() -> None:
    _, thinking_text, _ = None, *GOLDEN["content_then_parallel_calls"][1:2], None
    _, events = stream([thinking_text], True)
    kinds = [(type(e).__name__, getattr(e, "index", None)) for e in events]
    assert kinds == [
        ("ReasoningDelta", None),
        ("ContentDelta", None),
        ("ToolCallStart", 0),
        ("ToolCallArgsDelta", 0),
        ("ToolCallEnd", 0),
        ("ToolCallStart", 1),
        ("ToolCallArgsDelta", 1),
        ("ToolCallEnd", 1),
        ("ToolCallStart", 2),
        ("ToolCallArgsDelta", 2),
        ("ToolCallEnd", 2),
    ]


def test_call_ids_are_unique_openai_style() -> None:
    text = block(*(inv("f", par("a", str(i))) for i in range(50)))
    ids = [c.id for c in parse_completion(text, False).tool_calls]
    assert len(set(ids)) == 50 and all(i.startswith("call_") and len(i) > 10 for i in ids)


def test_tool_calls_disabled_removes_blocks_without_reporting() -> None:
    text = "Sure." + block(inv("bash", par("command", "rm -rf /"))) + "\n\nAnything else?" + EOS
    parsed, events = stream(token_deltas(text), False, tool_calls=False)
    check_events(events)
    assert summary(parsed) == ("", "Sure.\n\nAnything else?", [])


def test_feed_after_finish_is_an_error() -> None:
    parser = OutputParser(False)
    parser.finish()
    with pytest.raises(RuntimeError):
        parser.feed("x")


def test_to_message() -> None:
    parsed = parse_completion("R</think>C" + block(inv("f", par("a", "1"))), True, id_factory=counter_ids())
    assert parsed.to_message() == {
        "role": "assistant",
        "content": "C",
        "reasoning_content": "R",
        "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": "f", "arguments": '{"a": "1"}'}}
        ],
    }


def test_count_reasoning_tokens() -> None:
    tok = tokenizer()

    def ids(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False).ids

    reasoning = ids("Let me work this out step by step.")
    assert count_reasoning_tokens(ids("Let me work this out step by step.</think>Answer: 4"), True) == len(
        reasoning
    )
    no_end = ids("Call it." + block(inv("bash", par("command", "ls"))))
    assert count_reasoning_tokens(no_end, True) == no_end.index(128825)
    assert count_reasoning_tokens(ids("still thinking"), True) == len(ids("still thinking"))
    assert count_reasoning_tokens(ids("x</think>y"), False) == 0
