"""DeepSeek-V4 chat encoding: an OpenAI-format request -> the prompt text the model was trained on.

For the equivalent input the output is byte-identical to DeepSeek's reference `encoding_dsv4.encode_messages`
(tests/server/test_chat_encoding.py compares the two on a corpus). How OpenAI input maps onto V4:

* Request-level `tools` (and a `response_format` JSON schema) are written into the leading system (or
  developer) message; without one, an empty system message is added. Tools make V4 keep every turn's
  reasoning.
* Consecutive leading system messages are joined with a blank line. A system message later in the
  conversation becomes user text (V4 has no marker for it: the reference glues it onto the previous turn).
* Tool results and user text that follow each other form one user turn; results are put in the order of
  the calls they answer (`tool_call_id`), as the reference does.
* Content given as a list of parts is joined with blank lines; only text parts are accepted, except in tool
  results, where other parts become "[Unsupported <type>]" like the reference.
* OpenAI's `developer` role is the system prompt of newer clients (Codex, Responses API), so by default it
  is treated as `system`. V4's own developer role (`developer_as_system=False`) renders as a user turn and,
  in thinking mode without tools, is dropped as soon as any user message follows it, on the first turn too:
  instructions sent that way silently vanish.

Prefix stability (what a multi-turn prefix cache sees): with tools, or in chat mode, the prompt of turn k
(generation prompt included) is a prefix of turn k+1's, provided the client sends history back unchanged.
In thinking mode without tools it is not: V4 drops the reasoning of turns before the last user message, so
the `<think>` that ends turn k's prompt becomes `</think>` in turn k+1 (and earlier developer messages
vanish); everything before that last token still matches.

V4.1 (`family="v41"`) is encoded like V4 except for its numeric reasoning effort; the line used is the one
public V4.1 encoders print. Unverified: no V4.1 reference encoder is available here, and those encoders show
further differences (a `<｜System｜>` token, other DSML tag names) that are not implemented.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from v4serve.server import tool_calls as dsml
from v4serve.server.reasoning import Family, effort_preamble

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
THINK_START = "<think>"
THINK_END = "</think>"

_RESPONSE_FORMAT_HEAD = "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"
_ROLES = ("system", "developer", "user", "assistant", "tool")
_NAME_FORBIDDEN = set('"<>\n')


class ChatFormatError(ValueError):
    """A request that cannot be encoded; the message says what is wrong (the server answers HTTP 400)."""


# --------------------------------------------------------------------------------------------------------
# Turns: the conversation after mapping OpenAI messages onto V4's roles
# --------------------------------------------------------------------------------------------------------


@dataclass
class _Part:
    text: str
    result_of: str | None = None  # tool_call_id for a tool result, None for plain user text

    def render(self) -> str:
        return self.text if self.result_of is None else f"<tool_result>{self.text}</tool_result>"


@dataclass
class _Turn:
    role: Literal["system", "developer", "user", "assistant"]
    text: str = ""  # system/developer text or assistant content
    parts: list[_Part] = field(default_factory=list)  # user turns
    reasoning: str | None = None
    calls: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)  # (id, name, arguments)
    tools: list[dict[str, Any]] | None = None
    schema: Any = None
    open_ended: bool = False  # final assistant message the model continues: no EOS


def _text(content: Any, where: str, *, tool_result: bool = False) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ChatFormatError(f"{where}: content must be a string or a list of content parts")
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif tool_result:
            texts.append(f"[Unsupported {kind}]")
        else:
            raise ChatFormatError(f"{where}: unsupported content part {kind!r} (DeepSeek-V4 takes text only)")
    return "\n\n".join(texts)


def _calls(msg: Mapping[str, Any], where: str) -> list[tuple[str, str, dict[str, Any]]]:
    calls = []
    for j, call in enumerate(msg.get("tool_calls") or []):
        fn = call.get("function") if isinstance(call, Mapping) else None
        name = fn.get("name") if isinstance(fn, Mapping) else None
        if not isinstance(name, str) or not name:
            raise ChatFormatError(f"{where}.tool_calls[{j}]: function.name is missing")
        call_id = call.get("id") or fn.get("id") or ""
        calls.append((str(call_id), name, dsml.history_arguments(fn.get("arguments"))))
    return calls


def _turns(
    messages: Sequence[Mapping[str, Any]], continue_final_message: bool, developer_as_system: bool,
    plain: Callable[[str], str] | None = None,
) -> list[_Turn]:
    if not isinstance(messages, Sequence) or isinstance(messages, str) or not messages:
        raise ChatFormatError("messages must be a non-empty list")
    last = messages[-1].get("role") if isinstance(messages[-1], Mapping) else None
    if continue_final_message and last != "assistant":
        raise ChatFormatError(f"continue_final_message needs a final assistant message to continue; the last message "
                              f"is {last!r} (use add_generation_prompt for a new assistant turn)")
    turns: list[_Turn] = []
    prev_role = None
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        role = msg.get("role") if isinstance(msg, Mapping) else None
        if role not in _ROLES:
            raise ChatFormatError(f"{where}: unknown role {role!r}; expected one of {', '.join(_ROLES)}")
        tool_result = role == "tool"
        text = _text(msg.get("content"), where, tool_result=tool_result)
        if plain is not None and role != "assistant":
            text = plain(text)
        if role == "developer" and developer_as_system:
            role = "system"
        leading = all(t.role == "system" for t in turns)
        if role == "system" and leading:
            if turns:
                turns[0].text += "\n\n" + text
            else:
                turns.append(_Turn("system", text))
        elif role == "developer":
            if not text:
                raise ChatFormatError(f"{where}: a developer message needs non-empty content")
            turns.append(_Turn("developer", text))
        elif role == "assistant":
            reasoning = msg.get("reasoning_content", msg.get("reasoning"))
            open_ended = i == len(messages) - 1 and (continue_final_message or msg.get("prefix") is True)
            turns.append(
                _Turn(
                    "assistant",
                    text,
                    reasoning=reasoning or None,
                    calls=_calls(msg, where),
                    open_ended=open_ended,
                )
            )
        else:  # user, tool, or a late system message: all user text in V4
            if tool_result and not (prev_role == "tool" or (prev_role == "assistant" and turns[-1].calls)):
                raise ChatFormatError(
                    f"{where}: a tool message must follow an assistant message with tool_calls "
                    "(or another tool message)"
                )
            part = _Part(text, str(msg.get("tool_call_id") or "") if tool_result else None)
            if turns and turns[-1].role == "user":
                turns[-1].parts.append(part)
            else:
                turns.append(_Turn("user", parts=[part]))
        prev_role = role
    _order_tool_results(turns)
    return turns


def _order_tool_results(turns: list[_Turn]) -> None:
    """Tool results in the order of the calls they answer; unknown ids sort as the first call."""
    order: dict[str, int] = {}
    for turn in turns:
        if turn.role == "assistant" and turn.calls:
            order = {call_id: j for j, (call_id, _, _) in enumerate(turn.calls) if call_id}
        elif turn.role == "user" and order:
            slots = [j for j, p in enumerate(turn.parts) if p.result_of is not None]
            if len(slots) > 1:
                ranked = sorted((turn.parts[j] for j in slots), key=lambda p: order.get(p.result_of or "", 0))
                for j, part in zip(slots, ranked):
                    turn.parts[j] = part


# --------------------------------------------------------------------------------------------------------
# Request options
# --------------------------------------------------------------------------------------------------------


def validate_tools(tools: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    """The function definitions of OpenAI-format tools, checked; raises ChatFormatError."""
    functions: list[dict[str, Any]] = []
    seen: set[str] = set()
    for i, tool in enumerate(tools or []):
        where = f"tools[{i}]"
        if not isinstance(tool, Mapping) or tool.get("type", "function") != "function":
            raise ChatFormatError(f'{where}: expected {{"type": "function", "function": {{...}}}}')
        fn = tool.get("function")
        if not isinstance(fn, Mapping):
            raise ChatFormatError(f"{where}: the function definition is missing")
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise ChatFormatError(f"{where}: function.name is missing")
        if _NAME_FORBIDDEN & set(name):
            raise ChatFormatError(
                f"{where}: function name {name!r} contains a quote, angle bracket or newline"
            )
        if name in seen:
            raise ChatFormatError(f"{where}: duplicate function name {name!r}")
        params = fn.get("parameters")
        if params is not None and (
            not isinstance(params, Mapping) or params.get("type", "object") not in ("object", "dict")
        ):
            raise ChatFormatError(f"{where} ({name}): parameters must be a JSON schema of type object (or \"dict\")")
        if fn.get("description") is not None and not isinstance(fn.get("description"), str):
            raise ChatFormatError(f"{where} ({name}): description must be a string")
        seen.add(name)
        functions.append(copy_json(fn))
    return functions


def copy_json(value: Any) -> Any:
    """A deep copy of decoded JSON without recursion (schemas may nest hundreds of levels: copy.deepcopy would
    overflow Python's stack)."""
    root: list[Any] = [None]
    stack: list[tuple[Any, Any, Any]] = [(value, root, 0)]
    while stack:
        v, parent, key = stack.pop()
        if isinstance(v, Mapping):
            parent[key] = dict.fromkeys(v)  # keys in their order now; values filled as the stack unwinds
            stack += [(x, parent[key], k) for k, x in v.items()]
        elif isinstance(v, list):
            parent[key] = [None] * len(v)
            stack += [(x, parent[key], i) for i, x in enumerate(v)]
        else:
            parent[key] = v
    return root[0]


def _response_schema(response_format: Mapping[str, Any] | None) -> Any:
    """The JSON schema to write into the prompt; `json_object` and `text` add nothing (the server enforces
    those by decoding)."""
    if not response_format or response_format.get("type") in ("text", "json_object"):
        return None
    spec = response_format.get("json_schema") if response_format.get("type") == "json_schema" else None
    if not isinstance(spec, Mapping) or not isinstance(spec.get("schema"), Mapping):
        raise ChatFormatError(
            'response_format: expected {"type": "json_schema", "json_schema": {"schema": {...}}}'
        )
    return spec["schema"]


# --------------------------------------------------------------------------------------------------------
# Encoding
# --------------------------------------------------------------------------------------------------------


def encode_chat(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    thinking: bool = False,
    reasoning_effort: str | int | None = None,
    add_generation_prompt: bool = True,
    *,
    response_format: Mapping[str, Any] | None = None,
    family: Family = "v4",
    drop_thinking: bool = True,
    continue_final_message: bool = False,
    developer_as_system: bool = True,
    plain: Callable[[str], str] | None = None,
) -> str:
    """The prompt text for OpenAI-format `messages` and `tools` (BOS included, tokenize without specials).

    thinking: thinking mode (prompt ends with `<think>`) or chat mode (ends with `</think>`).
    reasoning_effort: "max" adds V4's maximum-effort preamble in thinking mode; other names change nothing
        in V4; "none" turns thinking off. V4.1 also takes an int 1-100.
    add_generation_prompt: end with the assistant header; False renders the history only.
    continue_final_message: a final assistant message is continued by the model (also when it carries
        DeepSeek's `"prefix": true`): rendered without EOS.
    drop_thinking: the reference's rule that drops earlier reasoning in thinking mode without tools.
    developer_as_system: OpenAI semantics for `developer` messages (see module doc); False: V4's role.
    plain: applied to the content of user, tool, system and developer messages (the server passes
        `Tokenizer.mark_plain`, so control-token strings in them tokenize as text and cannot forge turns).
    """
    if reasoning_effort == "none":
        thinking, reasoning_effort = False, None
    try:
        preamble = effort_preamble(reasoning_effort, family, thinking)
    except ValueError as err:
        raise ChatFormatError(str(err)) from None
    functions = validate_tools(tools)
    schema = _response_schema(response_format)
    turns = _turns(messages, continue_final_message, developer_as_system, plain)
    if functions or schema is not None:
        if turns[0].role not in ("system", "developer"):
            turns.insert(0, _Turn("system"))
        turns[0].tools, turns[0].schema = functions or None, schema
    last = turns[-1]
    if add_generation_prompt and last.role not in ("user", "developer") and not last.open_ended:
        raise ChatFormatError(
            "the conversation must end with a user or tool message (or a final assistant message to "
            'continue, marked with "prefix": true)'
        )
    drop = thinking and drop_thinking and not functions
    if drop:
        turns = _drop_old_thinking(turns)
    return BOS + preamble + _render(turns, thinking, drop, add_generation_prompt)


def _last_user(turns: list[_Turn]) -> int:
    return max((i for i, t in enumerate(turns) if t.role in ("user", "developer")), default=-1)


def _drop_old_thinking(turns: list[_Turn]) -> list[_Turn]:
    """V4's history rule without tools: developer turns before the last user turn disappear."""
    last_user = _last_user(turns)
    return [t for i, t in enumerate(turns) if i >= last_user or t.role != "developer"]


def _render(turns: list[_Turn], thinking: bool, drop: bool, add_generation_prompt: bool) -> str:
    last_user = _last_user(turns)
    out: list[str] = []
    for i, turn in enumerate(turns):
        if turn.role in ("system", "developer"):
            body = turn.text
            if turn.tools:
                body += "\n\n" + dsml.tools_prompt(turn.tools)
            if turn.schema is not None:
                body += "\n\n" + _RESPONSE_FORMAT_HEAD + dsml.to_json(turn.schema)
            out.append(body if turn.role == "system" else USER + body)
        elif turn.role == "user":
            out.append(USER + "\n\n".join(p.render() for p in turn.parts))
        else:
            if thinking and (not drop or i > last_user):
                out.append((turn.reasoning or "") + THINK_END)
            out.append(turn.text)
            if turn.calls:
                out.append(dsml.render_calls((name, args) for _, name, args in turn.calls))
            if not turn.open_ended:
                out.append(EOS)
        # The assistant header follows a user/developer turn that an assistant turn (or nothing) follows.
        is_last = i == len(turns) - 1
        answered = is_last or turns[i + 1].role == "assistant"
        if turn.role in ("user", "developer") and answered and (add_generation_prompt or not is_last):
            opens_reasoning = thinking and (not drop or i >= last_user)
            out.append(ASSISTANT + (THINK_START if opens_reasoning else THINK_END))
    return "".join(out)


# --------------------------------------------------------------------------------------------------------
# tool_choice
# --------------------------------------------------------------------------------------------------------


def _tool_choice(tool_choice: Any, tools: Sequence[Mapping[str, Any]] | None) -> tuple[str, str | None]:
    """("auto" | "none" | "required" | "function", function name or None), checked against the tools."""
    names = [f["name"] for f in validate_tools(tools)]
    if tool_choice is None:
        return "auto", None
    if isinstance(tool_choice, str):
        if tool_choice not in ("auto", "none", "required"):
            raise ChatFormatError(
                f"unknown tool_choice {tool_choice!r}; expected auto, none, required or a function"
            )
        if tool_choice == "required" and not names:
            raise ChatFormatError('tool_choice "required" needs at least one tool')
        return tool_choice, None
    fn = tool_choice.get("function") if isinstance(tool_choice, Mapping) else None
    name = fn.get("name") if isinstance(fn, Mapping) else None
    if name is None and isinstance(tool_choice, Mapping):
        name = tool_choice.get("name")  # Responses-API spelling
    if not isinstance(name, str) or not name:
        raise ChatFormatError('tool_choice must be "auto", "none", "required" or {"type": "function", ...}')
    if name not in names:
        raise ChatFormatError(f"tool_choice names function {name!r}, which is not among the tools")
    return "function", name


def tool_choice_mode(tool_choice: Any, tools: Sequence[Mapping[str, Any]] | None) -> tuple[str, str | None]:
    """("auto" | "none" | "required" | "function", the forced function's name or None); ChatFormatError when
    tool_choice does not fit the tools."""
    return _tool_choice(tool_choice, tools)


def tools_for_prompt(
    tool_choice: Any, tools: Sequence[Mapping[str, Any]] | None
) -> list[dict[str, Any]] | None:
    """The tools to pass to `encode_chat`: none at all for tool_choice "none" (OpenAI: the model must not
    call a tool, so it is not told about any; the server should also parse with
    `OutputParser(tool_calls=False)`)."""
    mode, _ = _tool_choice(tool_choice, tools)
    return None if mode == "none" or not tools else [dict(t) for t in tools]


def forced_prefix(tool_choice: Any, tools: Sequence[Mapping[str, Any]] | None, thinking: bool) -> str:
    """Text to append after the generation prompt so that the model must call a tool.

    "auto"/"none"/None: nothing. "required": the opening of the tool_calls block. A named function: that
    plus the opening of its invoke. In thinking mode the prefix first closes the think block, so a forced
    call comes without reasoning. Feed the same text to the OutputParser before the model's output.
    """
    mode, name = _tool_choice(tool_choice, tools)
    if mode in ("auto", "none"):
        return ""
    text = (THINK_END if thinking else "") + "\n\n" + dsml.TOOL_CALLS_OPEN + "\n"
    return text + (dsml.invoke_open(name) + "\n" if name else "")
