"""Responses API requests: the body model, and input items / tools / options -> the chat route's shapes.

* `instructions` -> a leading system message; `developer` messages are system turns (chat.encode_chat).
* Consecutive `reasoning` / assistant `message` / `function_call` items form one assistant turn
  (`reasoning_content`, content, `tool_calls`), so the history renders as the model wrote it;
  `function_call_output` -> a tool message. Items of tools this server ignores are skipped.
* Flat function tools -> chat tools (a forced call's arguments follow the schema; `strict` is not carried into
  the prompt); other tool types are ignored (the model cannot run hosted tools). `tool_choice` "allowed_tools"
  narrows the tools.
* `text.format` -> `response_format` (json_schema written into the prompt and enforced, json_object enforced, as on
  the chat route).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .errors import APIError
from .protocol import SamplingExtras


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, populate_by_name=True)


class _Reasoning(_Open):
    effort: str | int | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None


class _Format(_Open):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None
    description: str | None = None


class _Text(_Open):
    format: _Format | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ResponsesRequest(_Open, SamplingExtras):
    model: str | None = None
    input: str | list[dict[str, Any]] | None = None
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    reasoning: _Reasoning | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    text: _Text | None = None
    stream: bool | None = False
    store: bool | None = True
    previous_response_id: str | None = None
    # accepted, echoed, change nothing here
    metadata: dict[str, str] | None = None
    user: str | None = None
    include: list[str] | None = None
    prompt_cache_key: str | None = None
    client_metadata: dict[str, Any] | None = None
    service_tier: str | None = None
    truncation: Literal["auto", "disabled"] | None = None
    top_logprobs: int | None = None
    max_tool_calls: int | None = None
    safety_identifier: str | None = None
    background: bool | None = None
    stream_options: dict[str, Any] | None = None
    # more vLLM-style sampling extras (the rest come with SamplingExtras)
    top_k: int | None = None
    stop: str | list[str] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


# ------------------------------------------------------------------------------------------------------------
# input items -> chat messages
# ------------------------------------------------------------------------------------------------------------
_TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")


def _parts_text(content: Any, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise APIError(f"{where}: must be a string or a list of content parts", param=where)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
        else:
            raise APIError(f"{where}[{j}]: unsupported content part {kind!r} (DeepSeek-V4 reads text only: "
                           "input_text / output_text)", param=f"{where}[{j}]")
    return "\n\n".join(texts)


def _tool_output(output: Any, where: str) -> Any:
    """A function_call_output's output as tool-message content; non-text parts become "[Unsupported ...]"
    in the prompt, as DeepSeek's encoder writes them."""
    if isinstance(output, str):
        return output
    if not isinstance(output, list):
        raise APIError(f"{where}: must be a string or a list of content parts", param=where)
    return [{"type": "text", "text": p["text"]} if isinstance(p, dict) and isinstance(p.get("text"), str)
            else {"type": p.get("type") if isinstance(p, dict) else "unknown"} for p in output]


def _str_field(item: dict[str, Any], name: str, where: str) -> str:
    value = item.get(name)
    if not isinstance(value, str) or not value:
        raise APIError(f"{where}.{name}: must be a non-empty string", param=f"{where}.{name}")
    return value


def to_chat_messages(instructions: str | None, items: list[Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """(chat messages, types of the items skipped). Consecutive assistant-side items form one turn."""
    out: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    turn: dict[str, Any] | None = None  # the assistant message being built
    skipped: list[str] = []

    def assistant() -> dict[str, Any]:
        nonlocal turn
        if turn is None:
            turn = {"role": "assistant", "content": ""}
            out.append(turn)
        return turn

    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise APIError(f"{where}: must be an object (an input item)", param=where)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise APIError(f"{where}.role: must be user, assistant, system or developer, got {role!r}",
                               param=f"{where}.role")
            text = _parts_text(item.get("content"), f"{where}.content")
            if role == "assistant":
                assistant()["content"] += text
            else:
                turn = None
                out.append({"role": role, "content": text})
        elif kind == "function_call":
            args = item.get("arguments", "")
            if not isinstance(args, (str, dict)):
                raise APIError(f"{where}.arguments: must be a JSON string", param=f"{where}.arguments")
            call = {"id": _str_field(item, "call_id", where), "type": "function",
                    "function": {"name": _str_field(item, "name", where), "arguments": args}}
            assistant().setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            turn = None
            out.append({"role": "tool", "tool_call_id": _str_field(item, "call_id", where),
                        "content": _tool_output(item.get("output"), f"{where}.output")})
        elif kind == "reasoning":
            raw = item.get("content") or item.get("summary") or []
            text = _parts_text(raw, f"{where}.{'content' if item.get('content') else 'summary'}")
            if text:
                msg = assistant()
                msg["reasoning_content"] = msg.get("reasoning_content", "") + text
        elif kind == "item_reference":
            raise APIError(f"{where}: item_reference is not supported; send the item itself or use "
                           "previous_response_id", param=where, code="unsupported_parameter")
        elif isinstance(kind, str):
            skipped.append(kind)  # calls of tools this server ignores (web_search_call, ...)
        else:
            raise APIError(f"{where}.type: missing (an item needs a type, or a role for a message)",
                           param=f"{where}.type")
    return out, skipped


def input_items(value: str | list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    return list(value or [])


# ------------------------------------------------------------------------------------------------------------
# tools, tool_choice, reasoning, text.format
# ------------------------------------------------------------------------------------------------------------
def to_chat_tools(tools: list[dict[str, Any]] | None) -> tuple[list[dict[str, Any]], list[str]]:
    """(chat function tools, the types of the tools ignored)."""
    functions, ignored = [], []
    for i, tool in enumerate(tools or []):
        kind = tool.get("type")
        if kind != "function":
            ignored.append(str(kind))
            continue
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise APIError(f"tools[{i}].name: a function tool needs a name", param=f"tools[{i}].name")
        fn: dict[str, Any] = {"name": name}
        for key, kinds in (("description", str), ("parameters", dict)):
            if tool.get(key) is not None:
                if not isinstance(tool[key], kinds):
                    raise APIError(f"tools[{i}].{key}: must be a {'string' if kinds is str else 'JSON schema'}",
                                   param=f"tools[{i}].{key}")
                fn[key] = tool[key]
        functions.append({"type": "function", "function": fn})
    return functions, ignored


def to_chat_tool_choice(choice: str | dict[str, Any] | None,
                        tools: list[dict[str, Any]]) -> tuple[Any, list[dict[str, Any]]]:
    """(chat tool_choice, the tools to offer): "allowed_tools" narrows the tools; hosted tools cannot be
    forced because they are not offered."""
    if choice is None or isinstance(choice, str):
        return choice or "auto", tools
    kind = choice.get("type")
    if kind == "function":  # the chat shape {"function": {"name"}} is tolerated too
        nested = choice.get("function")
        name = choice.get("name") or (nested.get("name") if isinstance(nested, dict) else None)
        return {"type": "function", "function": {"name": name}}, tools
    if kind == "allowed_tools":
        allowed = {t.get("name") for t in choice.get("tools") or [] if isinstance(t, dict)}
        mode = choice.get("mode", "auto")
        if mode not in ("auto", "required"):
            raise APIError(f'tool_choice.mode: must be "auto" or "required", got {mode!r}', param="tool_choice.mode")
        return mode, [t for t in tools if t["function"]["name"] in allowed]
    raise APIError(f"tool_choice: {kind!r} cannot be forced here: only function tools are supported",
                   param="tool_choice", code="unsupported_parameter")


def to_response_format(text: _Text | None) -> dict[str, Any] | None:
    fmt = text.format if text else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    if fmt.schema_ is None:
        raise APIError("text.format.schema: a json_schema format needs a schema", param="text.format.schema",
                       code="missing_required_parameter")
    return {"type": "json_schema", "json_schema": {"name": fmt.name, "schema": fmt.schema_, "strict": fmt.strict}}


def echo_fields(req: ResponsesRequest) -> dict[str, Any]:
    """The request settings a response object repeats."""
    def given(value: Any, default: Any) -> Any:
        return default if value is None else value

    text = req.text.model_dump(by_alias=True, exclude_none=True) if req.text else {}
    text.setdefault("format", {"type": "text"})
    return {"instructions": req.instructions, "tools": req.tools or [], "tool_choice": given(req.tool_choice, "auto"),
            "parallel_tool_calls": req.parallel_tool_calls is not False, "temperature": given(req.temperature, 1.0),
            "top_p": given(req.top_p, 1.0), "max_output_tokens": req.max_output_tokens,
            "previous_response_id": req.previous_response_id, "store": req.store is not False, "text": text,
            "reasoning": {"effort": req.reasoning.effort if req.reasoning else None,
                          "summary": req.reasoning.summary if req.reasoning else None},
            "metadata": req.metadata or {}, "user": req.user, "service_tier": given(req.service_tier, "default"),
            "truncation": given(req.truncation, "disabled"), "prompt_cache_key": req.prompt_cache_key,
            "background": False, "max_tool_calls": req.max_tool_calls, "top_logprobs": given(req.top_logprobs, 0),
            "safety_identifier": req.safety_identifier}
