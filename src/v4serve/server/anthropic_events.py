"""Anthropic Messages output: parser events -> content blocks and streaming events.

Independent of HTTP and the engine (tested with scripted model text). A stream is:
message_start, then per content block content_block_start / content_block_delta* / content_block_stop
(blocks: `thinking` with thinking_delta and a closing signature_delta, `text` with text_delta, `tool_use`
with input_json_delta carrying the arguments' JSON as it is generated), then message_delta with
stop_reason and usage, then message_stop.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from .parsers import (
    ContentDelta,
    Event,
    ReasoningDelta,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallStart,
    collect,
)
from .streaming import sse

if TYPE_CHECKING:
    from .openai_chat import ChatChoice

Sse = tuple[str, dict[str, Any]]  # (event name, data)


def parse_tool_input(arguments: str) -> dict[str, Any]:
    """A tool call's JSON arguments as the `input` object (an unfinished call's unparsable text: {})."""
    try:
        value = json.loads(arguments) if arguments else {}
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {"value": value}


def stop_reason(choice: ChatChoice) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) in Anthropic's terms."""
    if choice.engine_reason == "length":
        return "max_tokens", None
    if isinstance(choice.stop_reason, str):
        return "stop_sequence", choice.stop_reason
    if choice.made_calls:
        return "tool_use", None
    return "end_turn", None


class MessageAssembler:
    """One message: the non-streaming body, or its events as output arrives."""

    def __init__(self, message_id: str, model: str, prompt_tokens: int) -> None:
        self.message_id, self.model, self.prompt_tokens = message_id, model, prompt_tokens
        self._index = -1  # index of the open content block
        self._open: str | None = None  # its type

    def usage(self, choice: ChatChoice) -> dict[str, int]:
        cached = min(choice.num_cached_tokens, self.prompt_tokens)
        return {"input_tokens": self.prompt_tokens - cached, "output_tokens": choice.num_output_tokens,
                "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}

    def _shell(self, choice: ChatChoice, content: list[dict[str, Any]], reason: str | None,
               sequence: str | None) -> dict[str, Any]:
        return {"id": self.message_id, "type": "message", "role": "assistant", "model": self.model,
                "content": content, "stop_reason": reason, "stop_sequence": sequence, "usage": self.usage(choice)}

    # --- non-streaming ------------------------------------------------------------------------------------
    def message(self, choice: ChatChoice) -> dict[str, Any]:
        parsed = collect(choice.events)
        content: list[dict[str, Any]] = []
        if parsed.reasoning:
            content.append({"type": "thinking", "thinking": parsed.reasoning, "signature": ""})
        if parsed.content:
            content.append({"type": "text", "text": parsed.content})
        for call in parsed.tool_calls:
            content.append({"type": "tool_use", "id": call.id, "name": call.name,
                            "input": parse_tool_input(call.arguments)})
        return self._shell(choice, content, *stop_reason(choice))

    # --- streaming ----------------------------------------------------------------------------------------
    def start(self, choice: ChatChoice) -> bytes:
        return (sse({"type": "message_start", "message": self._shell(choice, [], None, None)}, "message_start")
                + sse({"type": "ping"}, "ping"))

    def events(self, choice: ChatChoice, events: list[Event]) -> list[Sse]:
        out: list[Sse] = []
        for ev in events:
            if isinstance(ev, ReasoningDelta):
                self._ensure(out, "thinking", {"type": "thinking", "thinking": "", "signature": ""})
                out.append(self._delta({"type": "thinking_delta", "thinking": ev.text}))
            elif isinstance(ev, ContentDelta):
                self._ensure(out, "text", {"type": "text", "text": ""})
                out.append(self._delta({"type": "text_delta", "text": ev.text}))
            elif isinstance(ev, ToolCallStart):
                self._close(out)
                self._begin(out, "tool_use", {"type": "tool_use", "id": ev.id, "name": ev.name, "input": {}})
            elif isinstance(ev, ToolCallArgsDelta) and self._open == "tool_use":
                out.append(self._delta({"type": "input_json_delta", "partial_json": ev.text}))
            elif isinstance(ev, ToolCallEnd):
                self._close(out)
        return out

    def finish(self, choice: ChatChoice) -> list[Sse]:
        out: list[Sse] = []
        self._close(out)
        reason, sequence = stop_reason(choice)
        out.append(("message_delta", {"type": "message_delta",
                                      "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                      "usage": self.usage(choice)}))
        out.append(("message_stop", {"type": "message_stop"}))
        return out

    def _ensure(self, out: list[Sse], kind: str, block: dict[str, Any]) -> None:
        if self._open != kind:
            self._close(out)
            self._begin(out, kind, block)

    def _begin(self, out: list[Sse], kind: str, block: dict[str, Any]) -> None:
        self._index += 1
        self._open = kind
        out.append(("content_block_start", {"type": "content_block_start", "index": self._index,
                                            "content_block": block}))

    def _delta(self, delta: dict[str, Any]) -> Sse:
        return ("content_block_delta", {"type": "content_block_delta", "index": self._index, "delta": delta})

    def _close(self, out: list[Sse]) -> None:
        if self._open is None:
            return
        if self._open == "thinking":
            out.append(self._delta({"type": "signature_delta", "signature": ""}))
        out.append(("content_block_stop", {"type": "content_block_stop", "index": self._index}))
        self._open = None
