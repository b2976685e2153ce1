"""What a request asks the engine to enforce, as one `StructuredOutputsParams` (engine/guided.py compiles it).

Sources, each a 400 naming its field when malformed or when the grammar library refuses it:
* `response_format` (chat; `text.format` on the Responses API): `json_schema` -> the schema (always strict: nothing
  the schema does not name), `json_object` -> any JSON object, `text` -> nothing;
* vLLM's `structured_outputs` extra body: one of `json`, `regex`, `choice`, `grammar` (EBNF, or Lark),
  `json_object`, `structural_tag`; vLLM's option keys (`disable_any_whitespace`, ...) are accepted and change
  nothing (whitespace is always bounded, extra properties never allowed); the older top-level `guided_json`,
  `guided_regex`, `guided_choice`, `guided_grammar` mean the same;
* `tool_choice` "required" / a named function: valid DSML whose arguments match the tool's schema
  (server/tool_grammar.py). A forced call takes precedence over a response format, which applies to the answer of
  a later turn.
Two explicit sources in one request (e.g. `response_format` and `structured_outputs`) are a 400.

`check` compiles the grammar without a tokenizer (cached), in the caller's worker thread: the first call also
imports xgrammar (about a second and a half).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..engine.sampling_params import SamplingParamsError, StructuredOutputsParams
from .errors import APIError
from .tool_grammar import forced_call_tag

log = logging.getLogger("v4serve.server")

GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
_KEYS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
_VLLM_OPTIONS = ("disable_fallback", "disable_any_whitespace", "disable_additional_properties", "whitespace_pattern",
                 "backend")


@dataclass(frozen=True)
class Constraint:
    spec: StructuredOutputsParams
    param: str  # the request field it came from: errors name it
    fallback: StructuredOutputsParams | None = None  # a forced call's shape-only grammar, if the schemas fail


def _json_text(value: Any, param: str) -> str:
    """A schema as the JSON text the spec carries (given as an object or already as text)."""
    if isinstance(value, str):
        return value
    if not isinstance(value, Mapping):
        raise APIError(f"{param}: must be a JSON schema (an object, or its JSON text)", param=param)
    try:
        return json.dumps(value, ensure_ascii=False)
    except RecursionError:
        raise APIError(f"{param}: the schema nests too deeply", param=param) from None


def _spec(kind: str, value: Any, param: str) -> StructuredOutputsParams:
    if kind == "json":
        return StructuredOutputsParams(json=_json_text(value, param))
    if kind == "json_object":
        if value is not True:
            raise APIError(f"{param}: must be true", param=param)
        return StructuredOutputsParams(json_object=True)
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
            raise APIError(f"{param}: must be a non-empty list of strings", param=param)
        return StructuredOutputsParams(choice=tuple(value))
    if kind == "structural_tag" and isinstance(value, Mapping):
        value = _json_text(value, param)
    if not isinstance(value, str) or not value:
        raise APIError(f"{param}: must be a non-empty string", param=param)
    return StructuredOutputsParams(**{kind: value})


def from_response_format(rf: Mapping[str, Any] | None, param: str = "response_format") -> Constraint | None:
    """`{"type": "json_schema", "json_schema": {"schema": ...}}` / `{"type": "json_object"}` / `{"type": "text"}`."""
    if not rf:
        return None
    kind = rf.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return Constraint(StructuredOutputsParams(json_object=True), param)
    spec = rf.get("json_schema") if kind == "json_schema" else None
    if not isinstance(spec, Mapping) or not isinstance(spec.get("schema"), Mapping):
        raise APIError(f'{param}: expected {{"type": "json_schema", "json_schema": {{"schema": {{...}}}}}}, '
                       '{"type": "json_object"} or {"type": "text"}', param=param)
    return Constraint(StructuredOutputsParams(json=_json_text(spec["schema"], param)), param)


def from_extras(extras: Mapping[str, Any]) -> list[Constraint]:
    """vLLM's `structured_outputs` object and the older top-level `guided_*` fields, as given."""
    found: list[Constraint] = []
    so = extras.get("structured_outputs")
    if so is not None:
        if not isinstance(so, Mapping):
            raise APIError("structured_outputs: must be an object, e.g. {\"json\": {...}}", param="structured_outputs")
        unknown = sorted(set(so) - set(_KEYS) - set(_VLLM_OPTIONS))
        if unknown:
            raise APIError(f"structured_outputs: unknown key {unknown[0]!r}; expected one of {', '.join(_KEYS)}",
                           param=f"structured_outputs.{unknown[0]}")
        given = [k for k in _KEYS if so.get(k) not in (None, False)]
        if len(given) != 1:
            raise APIError(f"structured_outputs: give exactly one of {', '.join(_KEYS)} (found: "
                           f"{', '.join(given) or 'none'})", param="structured_outputs")
        param = f"structured_outputs.{given[0]}"
        found.append(Constraint(_spec(given[0], so[given[0]], param), param))
    for name, kind in GUIDED.items():
        if extras.get(name) is not None:
            found.append(Constraint(_spec(kind, extras[name], name), name))
    return found


def explicit(response_format: Mapping[str, Any] | None, extras: Mapping[str, Any]) -> Constraint | None:
    """The one constraint a request states (response format, structured_outputs or guided_*); two are a 400."""
    found = [c for c in [from_response_format(response_format)] if c is not None] + from_extras(extras)
    if len(found) > 1:
        raise APIError(f"{found[1].param}: only one structured-output constraint per request (also given: "
                       f"{found[0].param})", param=found[1].param)
    return found[0] if found else None


def for_chat(response_format: Mapping[str, Any] | None, extras: Mapping[str, Any], mode: str, name: str | None,
             functions: Sequence[Mapping[str, Any]], parallel: bool) -> Constraint | None:
    """The constraint of a chat request. `mode`, `name`: chat.tool_choice_mode's reading of tool_choice;
    `functions`: the validated function definitions offered."""
    stated = explicit(response_format, extras)
    if mode in ("required", "function") and functions:
        forced = name if mode == "function" else None
        return Constraint(StructuredOutputsParams(structural_tag=forced_call_tag(functions, forced, parallel)),
                          "tools", StructuredOutputsParams(structural_tag=forced_call_tag(functions, forced, parallel,
                                                                                          schemas=False)))
    return stated


def check(constraint: Constraint | None) -> StructuredOutputsParams | None:
    """The spec to send, after the grammar library accepted it (blocking: call from a worker thread).
    A forced call whose tool schemas the library cannot compile falls back to DSML-shaped arguments (one warning
    line); any other refusal is a 400 naming the field."""
    if constraint is None:
        return None
    from ..engine.guided import check as compile_check  # imports xgrammar

    try:
        compile_check(constraint.spec)
        return constraint.spec
    except SamplingParamsError as err:
        reason = str(err).split(": ", 1)[-1]
    if constraint.fallback is not None:
        log.warning("tool_choice: the tool schemas cannot be enforced (%s); arguments are constrained to valid DSML "
                    "only", reason)
        try:
            compile_check(constraint.fallback)
            return constraint.fallback
        except SamplingParamsError as err:
            reason = str(err).split(": ", 1)[-1]
    raise APIError(f"{constraint.param}: cannot be enforced: {reason}", param=constraint.param, code="invalid_value")
