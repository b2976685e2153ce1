"""Incremental parsing of DeepSeek-V4 output into reasoning, content and OpenAI tool calls.

`OutputParser.feed(delta)` takes decoded text in chunks of any size and returns events; text is held back
only while it could still be the start of markup, so no markup (`<｜DSML｜...>`, `</think>`, EOS, partial
tags) ever reaches reasoning, content or arguments, and the result does not depend on how the text was
chunked. `parse_completion` is the same machine run over a whole completion.

Recovery rules (the model does not always follow the format):
* a tool-call block (or a bare invoke) opened inside reasoning ends the reasoning: `</think>` was omitted;
* up to two newlines before a block belong to the block, as in the reference (`\\n\\n<｜DSML｜tool_calls>`);
* text after the block is content (whitespace-only tails are dropped); a second block continues the indexes;
* a missing `</｜DSML｜parameter>` or `</｜DSML｜invoke>` is implied by the next tag;
* anything else unexpected inside a block ends the block: the call in progress is closed (complete=False)
  and the text becomes content. Malformed tags are dropped; a tag cut off by the end of output too.
* string="false" values that are not valid JSON become JSON strings.
Inside a parameter value `<think>` / `</think>` are data (the reference keeps them too); EOS and DSML
markup are removed everywhere.
"""

from __future__ import annotations

import enum
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from v4serve.server import tool_calls as dsml
from v4serve.server.chat import ASSISTANT, BOS, EOS, THINK_END, THINK_START, USER


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ContentDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class ToolCallArgsDelta:
    index: int
    text: str  # a fragment of the arguments' JSON text


@dataclass(frozen=True, slots=True)
class ToolCallEnd:
    index: int
    complete: bool  # False: cut short by the end of output or by malformed markup


Event = ReasoningDelta | ContentDelta | ToolCallStart | ToolCallArgsDelta | ToolCallEnd


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


class _Mode(enum.Enum):
    REASONING = "reasoning"
    CONTENT = "content"
    BLOCK = "block"  # inside <tool_calls>, between invokes
    INVOKE = "invoke"  # inside an invoke, between parameters
    VALUE = "value"  # inside a parameter value


# Markup dropped wherever it appears (think tags are single tokens; `</think>` also ends reasoning).
_DROPPED = (EOS, BOS, USER, ASSISTANT, "<｜latest_reminder｜>", THINK_START, THINK_END, dsml.DSML)
_MARKERS = _DROPPED + dsml.TAG_PREFIXES
_HELD_NEWLINES = 2


@dataclass
class _Call:
    index: int
    args: dsml.ArgumentsJson = field(default_factory=dsml.ArgumentsJson)


class OutputParser:
    """Streaming parser for one completion. `thinking`: the prompt ends with `<think>`, so output starts
    in reasoning. `tool_calls=False` (tool_choice "none"): DSML blocks are still removed, calls are not
    reported. If a forced prefix was appended to the prompt (see chat.forced_prefix), feed it first."""

    def __init__(
        self, thinking: bool, *, tool_calls: bool = True, id_factory: Callable[[], str] = new_call_id
    ) -> None:
        self._mode = _Mode.REASONING if thinking else _Mode.CONTENT
        self._report_calls = tool_calls
        self._new_id = id_factory
        self._buf = ""
        self._final = False
        self._after_block = False  # whitespace after a closed block is held: kept only if text follows
        self._held_ws = ""
        self._content_seen = False
        self._call: _Call | None = None
        self._n_calls = 0
        self._events: list[Event] = []

    def feed(self, text: str) -> list[Event]:
        if self._final:
            raise RuntimeError("feed() after finish()")
        self._buf += text
        self._run()
        return self._take()

    def finish(self) -> list[Event]:
        if not self._final:
            self._final = True
            self._run()
            if self._call is not None:
                self._end_call(complete=False)
        return self._take()

    # ---- driver -------------------------------------------------------------------------------------

    def _run(self) -> None:
        while self._buf and self._step():
            pass

    def _step(self) -> bool:
        """Consume what can be decided now; False when more text is needed."""
        if self._mode in (_Mode.BLOCK, _Mode.INVOKE):
            return self._step_markup()
        buf, pos = self._buf, 0
        while True:
            p = _next_marker(buf, pos)
            if p < 0:
                self._emit_text(len(buf), hold=not self._final)
                return False
            kind, length = self._classify(p)
            if kind == "text":
                pos = p + 1
            elif kind == "wait":
                self._emit_text(p, hold=True)
                return False
            else:
                self._on_marker(p, kind, length)
                return True

    def _classify(self, p: int) -> tuple[str, int]:
        """What starts at buf[p]: ("tag"|"drop"|"text"|"wait", length)."""
        s = self._buf[p : p + dsml.MAX_TAG]  # bounded: values may hold long text with many "<"
        for prefix in dsml.TAG_PREFIXES:
            if s.startswith(prefix):
                end = dsml.tag_end(s, len(prefix))
                if end > 0:
                    return "tag", end
                if end == 0:
                    return ("drop", len(s)) if self._final else ("wait", 0)  # a tag cut off at the end
                return "drop", len(prefix)  # not a tag after all: only the DSML marker goes
        for marker in _DROPPED:
            if s.startswith(marker):
                if self._mode is _Mode.VALUE and marker in (THINK_START, THINK_END):
                    return "text", 0  # data inside a parameter (a file about think tags), as in the reference
                return "drop", len(marker)
        if any(m.startswith(s) for m in _MARKERS):
            if not self._final:
                return "wait", 0
            cut_special = len(s) > 1 and "｜" in s  # a special token or tag cut off at the end
            return ("drop", len(s)) if cut_special else ("text", 0)
        return "text", 0

    def _on_marker(self, p: int, kind: str, length: int) -> None:
        raw = self._buf[p : p + length]
        tag = dsml.parse_tag(raw) if kind == "tag" else None
        opens_block = tag is not None and not tag.closing and tag.name in (dsml.BLOCK, dsml.INVOKE)
        if self._mode is _Mode.VALUE:
            self._value_text(self._buf[:p])
        else:
            head = self._buf[:p]
            if opens_block:  # the blank line before a block is part of it
                head = head[: len(head) - _trailing_newlines(head)]
            self._text(head)
        self._buf = self._buf[p + length :]
        if raw == THINK_END and self._mode is _Mode.REASONING:
            self._mode = _Mode.CONTENT
        elif tag is not None:
            self._on_tag(tag)

    def _step_markup(self) -> bool:
        """Between tags inside a block: whitespace is layout; a tag moves on; anything else ends the block."""
        self._buf = self._buf.lstrip()
        if not self._buf:
            return False
        kind, length = self._classify(0) if self._buf[0] in "<｜" else ("text", 0)
        if kind == "wait":
            return False
        if kind == "text":
            if self._call is not None:
                self._end_call(complete=False)
            self._mode = _Mode.CONTENT
            return True
        self._on_marker(0, kind, length)
        return True

    # ---- tags ---------------------------------------------------------------------------------------

    def _on_tag(self, tag: dsml.DsmlTag) -> None:
        mode, call = self._mode, self._call
        in_block = mode in (_Mode.BLOCK, _Mode.INVOKE, _Mode.VALUE)
        if tag.closing:
            if tag.name == dsml.PARAM and mode is _Mode.VALUE and call is not None:
                self._emit_args(call, call.args.close_param())
                self._mode = _Mode.INVOKE
            elif tag.name == dsml.INVOKE and mode in (_Mode.INVOKE, _Mode.VALUE):
                self._end_call(complete=True)
                self._mode = _Mode.BLOCK
            elif tag.name == dsml.BLOCK and in_block:
                if self._call is not None:
                    self._end_call(complete=True)
                self._mode, self._after_block = _Mode.CONTENT, True
            return  # other closing tags are stray: dropped
        if not in_block and tag.name in (dsml.BLOCK, dsml.INVOKE):
            self._after_block, self._held_ws = False, ""  # a second block: the gap is layout
        if tag.name == dsml.BLOCK:
            if not in_block:
                self._mode = _Mode.BLOCK
        elif tag.name == dsml.INVOKE:
            if self._call is not None:
                self._end_call(complete=True)
            self._start_call(tag.attrs["name"])
        elif tag.name == dsml.PARAM and mode in (_Mode.INVOKE, _Mode.VALUE) and call is not None:
            if mode is _Mode.VALUE:
                self._emit_args(call, call.args.close_param())
            kind = "string" if tag.attrs.get("string") == "true" else "json"
            self._emit_args(call, call.args.open_param(tag.attrs["name"], kind))
            self._mode = _Mode.VALUE
        elif tag.name == dsml.PARAM and mode is _Mode.BLOCK:  # a parameter outside any invoke
            self._mode = _Mode.CONTENT

    def _start_call(self, name: str) -> None:
        self._call = _Call(self._n_calls)
        self._n_calls += 1
        self._mode = _Mode.INVOKE
        if self._report_calls:
            self._events.append(ToolCallStart(self._call.index, self._new_id(), name))

    def _end_call(self, complete: bool) -> None:
        call, self._call = self._call, None
        assert call is not None
        self._emit_args(call, call.args.close())
        if self._report_calls:
            self._events.append(ToolCallEnd(call.index, complete))

    # ---- output -------------------------------------------------------------------------------------

    def _emit_text(self, end: int, hold: bool) -> None:
        """Emit buf[:end]; with `hold`, keep trailing newlines back in case a block follows them."""
        if self._mode is _Mode.VALUE:
            self._value_text(self._buf[:end])
            self._buf = self._buf[end:]
            return
        if hold:
            end -= _trailing_newlines(self._buf[:end])
        self._text(self._buf[:end])
        self._buf = self._buf[end:]

    def _text(self, text: str) -> None:
        if self._mode is _Mode.REASONING:
            if text:
                self._events.append(ReasoningDelta(text))
            return
        if self._after_block:
            rest = text.lstrip()
            self._held_ws += text[: len(text) - len(rest)]
            if not rest:
                return
            text = (self._held_ws if self._content_seen else "") + rest
            self._after_block, self._held_ws = False, ""
        if text:
            self._content_seen = True
            self._events.append(ContentDelta(text))

    def _value_text(self, text: str) -> None:
        if text and self._call is not None:
            self._emit_args(self._call, self._call.args.value(text))

    def _emit_args(self, call: _Call, text: str) -> None:
        if text and self._report_calls:
            self._events.append(ToolCallArgsDelta(call.index, text))

    def _take(self) -> list[Event]:
        events, self._events = _coalesce(self._events), []
        return events


_MARKER_START = re.compile("[<｜]")  # every marker starts with one of these


def _next_marker(buf: str, pos: int) -> int:
    m = _MARKER_START.search(buf, pos)
    return m.start() if m else -1


def _trailing_newlines(text: str) -> int:
    n = 0
    while n < _HELD_NEWLINES and n < len(text) and text[len(text) - 1 - n] == "\n":
        n += 1
    return n


def _coalesce(events: list[Event]) -> list[Event]:
    """Merge neighbouring text deltas of the same kind (fewer, larger stream chunks)."""
    out: list[Event] = []
    for ev in events:
        prev = out[-1] if out else None
        if isinstance(ev, ReasoningDelta | ContentDelta) and type(prev) is type(ev):
            out[-1] = type(ev)(prev.text + ev.text)  # type: ignore[union-attr]
        elif (
            isinstance(ev, ToolCallArgsDelta)
            and isinstance(prev, ToolCallArgsDelta)
            and prev.index == ev.index
        ):
            out[-1] = ToolCallArgsDelta(ev.index, prev.text + ev.text)
        else:
            out.append(ev)
    return out


# --------------------------------------------------------------------------------------------------------
# Whole completions
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ParsedToolCall:
    id: str
    name: str
    arguments: str  # JSON object text
    complete: bool = True


@dataclass(frozen=True, slots=True)
class ParsedCompletion:
    reasoning: str
    content: str
    tool_calls: list[ParsedToolCall]

    def to_message(self) -> dict[str, Any]:
        """The OpenAI assistant message (what a client sends back in the next request's history)."""
        calls = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in self.tool_calls
        ]
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning:
            message["reasoning_content"] = self.reasoning
        if calls:
            message["tool_calls"] = calls
        return message


def collect(events: Sequence[Event]) -> ParsedCompletion:
    """Fold a stream of events into the message it describes."""
    reasoning, content = [], []
    calls: dict[int, dict[str, Any]] = {}
    for ev in events:
        if isinstance(ev, ReasoningDelta):
            reasoning.append(ev.text)
        elif isinstance(ev, ContentDelta):
            content.append(ev.text)
        elif isinstance(ev, ToolCallStart):
            calls[ev.index] = {"id": ev.id, "name": ev.name, "args": [], "complete": False}
        elif isinstance(ev, ToolCallArgsDelta):
            calls[ev.index]["args"].append(ev.text)
        elif isinstance(ev, ToolCallEnd):
            calls[ev.index]["complete"] = ev.complete
    tool_calls = [
        ParsedToolCall(c["id"], c["name"], "".join(c["args"]), c["complete"])
        for _, c in sorted(calls.items())
    ]
    return ParsedCompletion("".join(reasoning), "".join(content), tool_calls)


def parse_completion(
    text: str, thinking: bool, *, tool_calls: bool = True, id_factory: Callable[[], str] = new_call_id
) -> ParsedCompletion:
    """Non-streaming parse of one completion (the text generated after the prompt)."""
    parser = OutputParser(thinking, tool_calls=tool_calls, id_factory=id_factory)
    return collect(parser.feed(text) + parser.finish())
