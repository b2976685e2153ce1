"""The grammar of a forced tool call: `tool_choice` "required" or a named function, as valid DSML whose arguments
match the tool's JSON schema.

The prompt already ends with chat.forced_prefix (the tool_calls opening, and for a named function its invoke
opening), so the grammar describes what follows it:

* "required": one or more invokes of the offered functions (only one when `parallel_tool_calls` is false), then
  `</｜DSML｜tool_calls>`;
* named: that invoke's parameters, then `</｜DSML｜invoke>` and `</｜DSML｜tool_calls>`;
* then EOS (the engine's stop token ends every grammar).

It is an xgrammar structural tag (JSON, no xgrammar import here): an invoke is a tag around a JSON schema in
xgrammar's "deepseek_xml" style, which writes each argument as DSML writes it (`<｜DSML｜parameter name="k"
string="true">raw text</｜DSML｜parameter>` for strings, `string="false"` and JSON for the rest, in the schema's
order, required ones present). A function with `"strict": false` or without parameters gets any arguments (still
valid DSML). Whitespace between parameters is bounded like the JSON grammars' (engine/guided.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..engine.sampling_params import WHITESPACE_LIMIT
from . import tool_calls as dsml


def _arguments_schema(fn: Mapping[str, Any], schemas: bool) -> Any:
    params = fn.get("parameters")
    if not schemas or fn.get("strict") is False or params is None:
        return True  # any arguments
    return params


def _invoke_body(fn: Mapping[str, Any], schemas: bool) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": _arguments_schema(fn, schemas), "style": "deepseek_xml",
            "max_whitespace_cnt": WHITESPACE_LIMIT}


def forced_call_tag(functions: Sequence[Mapping[str, Any]], name: str | None, parallel: bool,
                    schemas: bool = True) -> str:
    """The structural tag (JSON text) for the output after chat.forced_prefix. `functions`: the validated function
    definitions offered; `name`: the forced function (None for "required"); `schemas`: False constrains only the
    DSML shape (the fallback when the library cannot compile a tool's schema)."""
    close_block = {"type": "const_string", "value": dsml.TOOL_CALLS_CLOSE}
    if name is not None:
        fn = next(f for f in functions if f["name"] == name)
        elements = [_invoke_body(fn, schemas),
                    {"type": "const_string", "value": dsml.INVOKE_CLOSE + "\n" + dsml.TOOL_CALLS_CLOSE}]
    else:
        invokes = [{"type": "tag", "begin": dsml.invoke_open(f["name"]) + "\n", "content": _invoke_body(f, schemas),
                    "end": dsml.INVOKE_CLOSE + "\n"} for f in functions]
        elements = [{"type": "tags_with_separator", "tags": invokes, "separator": "", "at_least_one": True,
                     "stop_after_first": not parallel}, close_block]
    tag = {"type": "structural_tag", "format": {"type": "sequence", "elements": elements}}
    return json.dumps(tag, ensure_ascii=False)
