"""The DSML tool-call format of DeepSeek-V4, in both directions.

Writing: the "## Tools" section of the system prompt and the `<｜DSML｜tool_calls>` block of an assistant turn
in the history (both must match DeepSeek's reference encoder byte for byte). Reading: the tag grammar and the
incremental JSON assembly that `parsers.OutputParser` uses to turn a streamed block into OpenAI arguments.

A block, as the model writes it:

    \\n\\n<｜DSML｜tool_calls>
    <｜DSML｜invoke name="NAME">
    <｜DSML｜parameter name="KEY" string="true">raw text</｜DSML｜parameter>
    <｜DSML｜parameter name="KEY2" string="false">JSON value</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜tool_calls>
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

DSML = "｜DSML｜"  # one special token (id 128825); every tag is "<" or "</" + DSML + name
BLOCK, INVOKE, PARAM = "tool_calls", "invoke", "parameter"
TOOL_CALLS_OPEN = f"<{DSML}{BLOCK}>"
TOOL_CALLS_CLOSE = f"</{DSML}{BLOCK}>"
INVOKE_CLOSE = f"</{DSML}{INVOKE}>"
PARAM_CLOSE = f"</{DSML}{PARAM}>"
TAG_PREFIXES = (f"<{DSML}", f"</{DSML}")


def invoke_open(name: str) -> str:
    return f'<{DSML}{INVOKE} name="{name}">'


def param_open(name: str, is_string: bool) -> str:
    return f'<{DSML}{PARAM} name="{name}" string="{"true" if is_string else "false"}">'


def to_json(value: Any) -> str:
    """The reference's JSON spelling: default separators, non-ASCII kept as is."""
    return json.dumps(value, ensure_ascii=False)


# --------------------------------------------------------------------------------------------------------
# Writing (prompt side)
# --------------------------------------------------------------------------------------------------------

# The fixed prose of the tools section, as DeepSeek ships it; only the schemas vary.
_TOOLS_INTRO = (
    "## Tools\n\n"
    "You have access to a set of tools to help answer the user's question. "
    f'You can invoke tools by writing a "<{DSML}{BLOCK}>" block like the following:\n\n'
    f"<{DSML}{BLOCK}>\n"
    f'<{DSML}{INVOKE} name="$TOOL_NAME">\n'
    f'<{DSML}{PARAM} name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</{DSML}{PARAM}>\n'
    "...\n"
    f"</{DSML}{INVOKE}>\n"
    f'<{DSML}{INVOKE} name="$TOOL_NAME2">\n'
    "...\n"
    f"</{DSML}{INVOKE}>\n"
    f"</{DSML}{BLOCK}>\n\n"
    'String parameters should be specified as is and set `string="true"`. For all other types (numbers, '
    'booleans, arrays, objects), pass the value in JSON format and set `string="false"`.\n\n'
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
    "<think>...</think> BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n"
)
_TOOLS_OUTRO = (
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n"
)


def tools_prompt(functions: Iterable[Mapping[str, Any]]) -> str:
    """The "## Tools" section: fixed prose, then one JSON line per function definition (as given)."""
    return _TOOLS_INTRO + "\n".join(to_json(dict(f)) for f in functions) + _TOOLS_OUTRO


def render_call(name: str, arguments: Mapping[str, Any]) -> str:
    """One invoke: strings go raw with string="true", everything else as JSON with string="false"."""
    params = [
        param_open(key, True) + value + PARAM_CLOSE
        if isinstance(value, str)
        else param_open(key, False) + to_json(value) + PARAM_CLOSE
        for key, value in arguments.items()
    ]
    return invoke_open(name) + "\n" + "\n".join(params) + "\n" + INVOKE_CLOSE


def render_calls(calls: Iterable[tuple[str, Mapping[str, Any]]]) -> str:
    """The block appended to an assistant turn's content, leading blank line included."""
    body = "\n".join(render_call(name, args) for name, args in calls)
    return "\n\n" + TOOL_CALLS_OPEN + "\n" + body + "\n" + TOOL_CALLS_CLOSE


def history_arguments(raw: Any) -> dict[str, Any]:
    """Arguments of a past call as a dict, whatever shape the client sent them in.

    OpenAI clients send a JSON string; the reference wraps anything that is not a JSON object as
    {"arguments": raw}. We do the same, except that an empty string means no arguments, a dict is taken as
    is, and a JSON string that itself holds a JSON object (double encoding) is unwrapped once.
    """
    if isinstance(raw, Mapping):
        return dict(raw)
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}
    value: Any = raw
    for _ in range(2):
        if not isinstance(value, str):
            break
        try:
            value = json.loads(value)
        except ValueError:
            break
    return dict(value) if isinstance(value, dict) else {"arguments": raw}


# --------------------------------------------------------------------------------------------------------
# Reading (output side)
# --------------------------------------------------------------------------------------------------------

_TAG_RE = re.compile(r'<(/?)｜DSML｜([A-Za-z_]+)((?:\s+[A-Za-z_]+="[^"]*")*)\s*>')
_ATTR_RE = re.compile(r'([A-Za-z_]+)="([^"]*)"')


MAX_TAG = 512  # a DSML tag with no ">" within this many characters is not a tag


def tag_end(s: str, start: int) -> int:
    """Where the tag that opens `s` ends: its length, 0 when `s` stops before the tag could end, or -1
    when it cannot be a tag (a "<" comes first, or no ">" within MAX_TAG characters)."""
    for i in range(start, min(len(s), MAX_TAG)):
        if s[i] == ">":
            return i + 1
        if s[i] == "<":
            return -1
    return 0 if len(s) < MAX_TAG else -1


@dataclass(frozen=True, slots=True)
class DsmlTag:
    closing: bool
    name: str
    attrs: dict[str, str] = field(default_factory=dict)


def parse_tag(text: str) -> DsmlTag | None:
    """A complete tag `<｜DSML｜name attr="v">` / `</｜DSML｜name>`, or None when it is not well formed."""
    m = _TAG_RE.fullmatch(text)
    if m is None:
        return None
    closing, name, attrs = m.group(1) == "/", m.group(2), dict(_ATTR_RE.findall(m.group(3)))
    if closing and attrs:
        return None
    if not closing and name in (INVOKE, PARAM) and not attrs.get("name"):
        return None
    return DsmlTag(closing, name, attrs)


ValueKind = Literal["string", "json"]


def _is_json(text: str) -> bool:
    def reject(constant: str) -> Any:  # Python accepts NaN/Infinity, JSON does not
        raise ValueError(constant)

    try:
        json.loads(text, parse_constant=reject)
    except ValueError:
        return False
    return True


@dataclass
class ArgumentsJson:
    """Builds one call's arguments as JSON text, piece by piece, in the reference's spelling
    `{"k": v, "k2": v2}`: the pieces concatenate to exactly the text the non-streaming parse gives.

    string="true" values stream as they arrive (escaped); string="false" values are held until their
    parameter closes, then written raw when they are valid JSON, or as a JSON string when they are not.
    """

    count: int = 0
    kind: ValueKind | None = None
    _held: list[str] = field(default_factory=list)

    def open_param(self, name: str, kind: ValueKind) -> str:
        head = ("{" if self.count == 0 else ", ") + to_json(name) + ": "
        self.count += 1
        self.kind = kind
        return head + ('"' if kind == "string" else "")

    def value(self, text: str) -> str:
        if self.kind == "string":
            return to_json(text)[1:-1]  # JSON string escaping is per character, so chunks compose
        self._held.append(text)
        return ""

    def close_param(self) -> str:
        kind, self.kind = self.kind, None
        if kind == "string":
            return '"'
        raw, self._held = "".join(self._held), []
        return raw if _is_json(raw) else to_json(raw)

    def close(self) -> str:
        tail = self.close_param() if self.kind is not None else ""
        return tail + ("{}" if self.count == 0 else "}")
