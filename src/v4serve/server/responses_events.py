"""Responses API output: parser events -> output items, stream events and the response object.

Independent of HTTP and the engine (tested with scripted model text). The same assembler builds both the
non-streaming body and the stream, so the two always agree. A stream is response.created,
response.in_progress, then per output item response.output_item.added, its own events, and
response.output_item.done, then response.completed / .incomplete / .failed with the whole response:

* reasoning: the model's reasoning, in full, as one summary part (reasoning_summary_part.added,
  reasoning_summary_text.delta*, .done, part.done): there is no separate summariser.
* message: content_part.added, output_text.delta*, output_text.done, content_part.done.
* function_call: function_call_arguments.delta* (the arguments' JSON as it is generated), .done.
Every event carries an increasing `sequence_number`.
"""

from __future__ import annotations

import copy
import time
import uuid
from typing import TYPE_CHECKING, Any

from .errors import APIError
from .parsers import ContentDelta, Event, ReasoningDelta, ToolCallArgsDelta, ToolCallEnd, ToolCallStart
from .streaming import sse

if TYPE_CHECKING:
    from .openai_chat import ChatChoice

def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def encode(events: list[dict[str, Any]]) -> bytes:
    return b"".join(sse(ev, ev["type"]) for ev in events)


class ResponseAssembler:
    """One response. `feed` takes parser events and returns stream events (dicts); `finish` closes it."""

    def __init__(self, response_id: str, model: str, prompt_tokens: int, echo: dict[str, Any]) -> None:
        self.id, self.model, self.prompt_tokens, self.echo = response_id, model, prompt_tokens, echo
        self.created_at = int(time.time())
        self.output: list[dict[str, Any]] = []
        self.status = "in_progress"
        self.error: dict[str, Any] | None = None
        self.usage: dict[str, Any] | None = None
        self._open: dict[str, Any] | None = None  # the item being generated
        self._calls: dict[int, dict[str, Any]] = {}  # parser call index -> its item
        self._seq = 0
        self._completed_at: int | None = None

    # --- the response object --------------------------------------------------------------------------
    def response(self) -> dict[str, Any]:
        incomplete = {"reason": "max_output_tokens"} if self.status == "incomplete" else None
        return {"id": self.id, "object": "response", "created_at": self.created_at, "status": self.status,
                "completed_at": self._completed_at, "error": self.error, "incomplete_details": incomplete,
                "model": self.model, "output": copy.deepcopy(self.output), "usage": self.usage, **self.echo}

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return event

    # --- streaming --------------------------------------------------------------------------------------
    def start(self) -> list[dict[str, Any]]:
        return [self._event("response.created", response=self.response()),
                self._event("response.in_progress", response=self.response())]

    def feed(self, events: list[Event]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for ev in events:
            if isinstance(ev, ReasoningDelta):
                item = self._ensure(out, "reasoning")
                item["summary"][0]["text"] += ev.text
                out.append(self._event("response.reasoning_summary_text.delta", **self._where(item),
                                       summary_index=0, delta=ev.text))
            elif isinstance(ev, ContentDelta):
                item = self._ensure(out, "message")
                item["content"][0]["text"] += ev.text
                out.append(self._event("response.output_text.delta", **self._where(item), content_index=0,
                                       delta=ev.text, logprobs=[]))
            elif isinstance(ev, ToolCallStart):
                self._close(out)
                item = {"type": "function_call", "id": new_id("fc"), "call_id": ev.id, "name": ev.name,
                        "arguments": "", "status": "in_progress"}
                self._calls[ev.index] = item
                self._add(out, item)
            elif isinstance(ev, ToolCallArgsDelta) and self._is_open_call(ev.index):
                item = self._calls[ev.index]
                item["arguments"] += ev.text
                out.append(self._event("response.function_call_arguments.delta", **self._where(item),
                                       delta=ev.text))
            elif isinstance(ev, ToolCallEnd) and self._is_open_call(ev.index):
                self._close(out, "completed" if ev.complete else "incomplete")
        return out

    def finish(self, choice: ChatChoice) -> list[dict[str, Any]]:
        """Close the open item and end the response (status from the engine's finish reason; an engine
        error after some output fails it)."""
        self.status = "incomplete" if choice.engine_reason == "length" else "completed"
        if choice.error:
            self.status, self.error = "failed", {"code": "server_error", "message": choice.error}
        out: list[dict[str, Any]] = []
        if not self.output and not choice.error:  # the model stopped at once: still answer with a message
            self._ensure(out, "message")
        self._close(out, "completed" if self.status == "completed" else "incomplete")
        self.usage = usage(self.prompt_tokens, choice)
        self._completed_at = int(time.time())
        out.append(self._event(f"response.{self.status}", response=self.response()))
        return out

    def fail(self, err: APIError) -> list[dict[str, Any]]:
        """An error after the stream started: an `error` event, then response.failed."""
        code = "server_error" if err.status >= 500 else "invalid_prompt"
        out: list[dict[str, Any]] = []
        self._close(out, "incomplete")
        self.status, self.error = "failed", {"code": code, "message": err.message}
        out.append(self._event("error", code=err.code or code, message=err.message, param=err.param))
        out.append(self._event("response.failed", response=self.response()))
        return out

    # --- items ------------------------------------------------------------------------------------------
    def _is_open_call(self, index: int) -> bool:
        return self._open is not None and self._calls.get(index) is self._open

    def _where(self, item: dict[str, Any]) -> dict[str, Any]:
        return {"item_id": item["id"], "output_index": len(self.output) - 1}

    def _ensure(self, out: list[dict[str, Any]], kind: str) -> dict[str, Any]:
        if self._open is not None and self._open["type"] == kind:
            return self._open
        self._close(out)
        item: dict[str, Any]
        if kind == "reasoning":
            item = {"type": "reasoning", "id": new_id("rs"), "summary": []}
        else:
            item = {"type": "message", "id": new_id("msg"), "role": "assistant", "status": "in_progress",
                    "content": []}
        self._add(out, item)
        if kind == "reasoning":
            part = {"type": "summary_text", "text": ""}
            out.append(self._event("response.reasoning_summary_part.added", **self._where(item), summary_index=0,
                                   part=dict(part)))
            item["summary"].append(part)
        else:
            part = {"type": "output_text", "text": "", "annotations": []}
            out.append(self._event("response.content_part.added", **self._where(item), content_index=0,
                                   part=copy.deepcopy(part)))
            item["content"].append(part)
        return item

    def _add(self, out: list[dict[str, Any]], item: dict[str, Any]) -> None:
        self.output.append(item)
        self._open = item
        out.append(self._event("response.output_item.added", output_index=len(self.output) - 1,
                               item=copy.deepcopy(item)))

    def _close(self, out: list[dict[str, Any]], status: str = "completed") -> None:
        item, self._open = self._open, None
        if item is None:
            return
        where = {"item_id": item["id"], "output_index": self.output.index(item)}
        if item["type"] == "reasoning":
            part = item["summary"][0]
            out.append(self._event("response.reasoning_summary_text.done", **where, summary_index=0,
                                   text=part["text"]))
            out.append(self._event("response.reasoning_summary_part.done", **where, summary_index=0,
                                   part=dict(part)))
        elif item["type"] == "message":
            part = item["content"][0]
            out.append(self._event("response.output_text.done", **where, content_index=0, text=part["text"],
                                   logprobs=[]))
            out.append(self._event("response.content_part.done", **where, content_index=0,
                                   part=copy.deepcopy(part)))
        else:
            out.append(self._event("response.function_call_arguments.done", **where,
                                   arguments=item["arguments"]))
        if "status" in item:
            item["status"] = status
        out.append(self._event("response.output_item.done", output_index=where["output_index"],
                               item=copy.deepcopy(item)))


def usage(prompt_tokens: int, choice: ChatChoice) -> dict[str, Any]:
    output = choice.num_output_tokens
    return {"input_tokens": prompt_tokens,
            "input_tokens_details": {"cached_tokens": min(choice.num_cached_tokens, prompt_tokens),
                                     "cache_write_tokens": 0},
            "output_tokens": output, "output_tokens_details": {"reasoning_tokens": choice.reasoning_tokens},
            "total_tokens": prompt_tokens + output}
