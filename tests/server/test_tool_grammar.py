"""The forced tool-call grammar accepts exactly the DSML that chat.forced_prefix + tool_calls.render_calls write."""

from __future__ import annotations

from typing import Any

import pytest

from v4serve.engine.guided import GrammarCompilerCache
from v4serve.engine.sampling_params import StructuredOutputsParams as S
from v4serve.server import structured
from v4serve.server import tool_calls as dsml
from v4serve.server.chat import forced_prefix
from v4serve.server.tool_grammar import forced_call_tag
from v4serve.tokenizer import default_tokenizer

TOK = default_tokenizer()
FORECAST = {"name": "forecast", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 7},
    "opts": {"type": "object", "properties": {"metric": {"type": "boolean"}}}}, "required": ["city", "days"]}}
CLOCK = {"name": "clock", "parameters": {"type": "object", "properties": {}}}
FREE = {"name": "free", "strict": False, "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}
TOOLS = [{"type": "function", "function": f} for f in (FORECAST, CLOCK, FREE)]


@pytest.fixture(scope="module")
def cache() -> GrammarCompilerCache:
    return GrammarCompilerCache(TOK)


def accepts(cache: GrammarCompilerCache, tag: str, text: str) -> bool:
    guide = cache.compile(S(structural_tag=tag)).matcher()
    return all(guide.accept(t) for t in TOK.encode(text)) and guide.accept(TOK.eos_id) and guide.terminated


def after_prefix(text: str, choice: Any) -> str:
    prefix = forced_prefix(choice, TOOLS, thinking=False)
    assert text.startswith(prefix)
    return text[len(prefix):]


def test_required_takes_any_offered_calls_written_as_dsml(cache: GrammarCompilerCache) -> None:
    tag = forced_call_tag([FORECAST, CLOCK, FREE], None, parallel=True)
    calls = dsml.render_calls([("forecast", {"city": "Oslo <b>", "days": 3, "opts": {"metric": True}}), ("clock", {})])
    assert accepts(cache, tag, after_prefix(calls, "required"))
    assert accepts(cache, tag, after_prefix(dsml.render_calls([("free", {"anything": [1, "x"]})]), "required"))
    assert not accepts(cache, tag, after_prefix(dsml.render_calls([("forecast", {"city": "Oslo", "days": 9})]),
                                                "required"))  # days > 7
    assert not accepts(cache, tag, after_prefix(dsml.render_calls([("forecast", {"days": 2})]), "required"))
    assert not accepts(cache, tag, after_prefix(dsml.render_calls([("nope", {})]), "required"))


def test_parallel_false_allows_one_call(cache: GrammarCompilerCache) -> None:
    tag = forced_call_tag([FORECAST, CLOCK], None, parallel=False)
    assert accepts(cache, tag, after_prefix(dsml.render_calls([("clock", {})]), "required"))
    assert not accepts(cache, tag, after_prefix(dsml.render_calls([("clock", {}), ("clock", {})]), "required"))


def test_a_named_function_continues_its_own_invoke(cache: GrammarCompilerCache) -> None:
    choice = {"type": "function", "function": {"name": "forecast"}}
    tag = forced_call_tag([FORECAST, CLOCK], "forecast", parallel=True)
    assert accepts(cache, tag, after_prefix(dsml.render_calls([("forecast", {"city": "Rome", "days": 1})]), choice))
    assert not accepts(cache, tag, after_prefix(dsml.render_calls([("forecast", {"city": "Rome"})]), choice))


def test_schemas_the_library_cannot_compile_fall_back_to_dsml_only() -> None:
    broken = {"name": "broken", "parameters": {"type": "object", "properties": {"a": {"$ref": "#/missing"}}}}
    constraint = structured.for_chat(None, {}, "required", None, [broken], parallel=True)
    assert constraint is not None and constraint.fallback is not None
    assert structured.check(constraint) == constraint.fallback
