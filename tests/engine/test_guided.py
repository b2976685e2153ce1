"""engine/guided.py: specs -> grammars, the vocabulary the grammars see, the reasoning gate, the compile cache."""

from __future__ import annotations

import json

import pytest
import torch

from v4serve.engine.guided import GrammarCompilerCache, GrammarError, check, choice_ebnf, grammar_for
from v4serve.engine.guided_admission import reasoning_open
from v4serve.engine.sampling_params import SamplingParams, SamplingParamsError
from v4serve.engine.sampling_params import StructuredOutputsParams as S
from v4serve.tokenizer import default_tokenizer

TOK = default_tokenizer()
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9},
                                           "s": {"type": "string", "maxLength": 3}},
          "required": ["n", "s"], "additionalProperties": False}


@pytest.fixture(scope="module")
def cache() -> GrammarCompilerCache:
    return GrammarCompilerCache(TOK)


def allowed(guide, vocab: int = TOK.vocab_size) -> set[int]:
    bitmask = torch.zeros(1, (vocab + 31) // 32, dtype=torch.int32)
    guide.fill(bitmask, 0)
    bits = ((bitmask[0].unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1).flatten()[:vocab]
    return set(bits.nonzero().flatten().tolist())


def feed(guide, text: str) -> bool:
    return all(guide.accept(t) for t in TOK.encode(text))


# --- specs ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec, field", [
    (S(json='{"type": "nope"}'), "structured_outputs.json"),
    (S(json="not json"), "structured_outputs.json"),
    (S(regex="(("), "structured_outputs.regex"),
    (S(grammar="root ::= missing_rule"), "structured_outputs.grammar"),
    (S(structural_tag='{"type": "structural_tag", "format": {"type": "bogus"}}'), "structured_outputs.structural_tag"),
])
def test_unusable_specs_name_their_field(spec: S, field: str) -> None:
    with pytest.raises(GrammarError) as err:
        check(spec)
    assert err.value.field == field
    assert "/project/" not in str(err.value) and len(str(err.value)) > len(field) + 5  # the library's reason, clean


@pytest.mark.parametrize("spec", [S(), S(json="{}", regex="a"), S(choice=()), S(regex="")])
def test_a_spec_names_exactly_one_constraint(spec: S) -> None:
    with pytest.raises(SamplingParamsError):
        spec.kind()
    with pytest.raises(SamplingParamsError):
        SamplingParams(structured_outputs=spec).validate(TOK.vocab_size)


def test_lark_grammars_are_accepted_when_not_ebnf() -> None:
    check(S(grammar='start: "yes" | "no"'))
    check(S(grammar='root ::= "yes" | "no"'))


def test_choice_literals_survive_quotes_backslashes_newlines_and_unicode(cache: GrammarCompilerCache) -> None:
    choices = ('say "hi"', "back\\slash", "two\nlines", "東京")
    assert choice_ebnf(choices).startswith("root ::= ")
    compiled = cache.compile(S(choice=choices))
    for choice in choices:
        guide = compiled.matcher()
        assert feed(guide, choice) and guide.accept(TOK.eos_id) and guide.terminated
    guide = compiled.matcher()
    assert not feed(guide, "say hi")


def test_specs_are_hashable_and_lists_become_tuples() -> None:
    params = SamplingParams(structured_outputs=S(choice=["a", "b"]))  # type: ignore[arg-type] - JSON gives lists
    assert params.structured_outputs == S(choice=("a", "b"))
    assert grammar_for(S(choice=("a", "b"))) is grammar_for(S(choice=("a", "b")))  # cached


# --- the grammar's vocabulary -----------------------------------------------------------------------------
def test_control_tokens_never_fit_a_json_string_and_eos_ends_the_grammar(cache: GrammarCompilerCache) -> None:
    guide = cache.compile(S(json=json.dumps(SCHEMA))).matcher()
    assert feed(guide, '{"n": 3, "s": "')
    inside = allowed(guide)
    controls = {TOK.think_start_id, TOK.think_end_id, TOK.bos_id, TOK.eos_id, TOK.token_to_id("｜DSML｜"),
                TOK.token_to_id("<｜User｜>"), TOK.token_to_id("<｜Assistant｜>")}
    assert not inside & controls
    assert TOK.encode("a")[0] in inside
    assert feed(guide, 'ab"}')
    assert allowed(guide) == {TOK.eos_id}  # complete: only EOS
    assert guide.accept(TOK.eos_id) and guide.terminated and not guide.active


def test_json_strings_never_take_raw_control_characters(cache: GrammarCompilerCache) -> None:
    """Length-bounded strings too (xgrammar's own rule for them lets control bytes through; the json vocabulary
    does not have them)."""
    guide = cache.compile(S(json=json.dumps(SCHEMA))).matcher()
    assert feed(guide, '{"n": 3, "s": "')
    inside = allowed(guide)
    raw_controls = [i for i in range(TOK.vocab_size) if set(TOK.token_bytes(i)) & (set(range(32)) - {10, 13})]
    assert raw_controls and not inside.intersection(raw_controls)
    assert not feed(cache.compile(S(json_object=True)).matcher(), '{"a": "x' + "\t" + 'y"}')  # a raw tab


def test_json_schema_is_strict_and_whitespace_is_bounded(cache: GrammarCompilerCache) -> None:
    guide = cache.compile(S(json=json.dumps(SCHEMA))).matcher()
    assert not feed(guide, '{"n": 3, "s": "x", "extra": 1}')  # no property the schema does not name
    guide = cache.compile(S(json=json.dumps(SCHEMA))).matcher()
    assert not feed(guide, "{" + " " * 17)  # at most WHITESPACE_LIMIT (16) in a row
    guide = cache.compile(S(json=json.dumps(SCHEMA))).matcher()
    assert not feed(guide, "{" + " " * 16 + '"n": 10')  # maximum 9


def test_json_object_takes_any_object_but_nothing_else(cache: GrammarCompilerCache) -> None:
    compiled = cache.compile(S(json_object=True))
    guide = compiled.matcher()
    assert feed(guide, '{"a": [1, {"b": null}], "c": "d"}') and guide.accept(TOK.eos_id)
    for not_object in ("[1]", '"text"', "42"):
        assert not feed(compiled.matcher(), not_object)


def test_equal_specs_compile_once(cache: GrammarCompilerCache) -> None:
    assert cache.compile(S(regex="[0-9]+")) is cache.compile(S(regex="[0-9]+"))


# --- reasoning gate ---------------------------------------------------------------------------------------
def test_the_guide_waits_for_the_end_of_the_reasoning(cache: GrammarCompilerCache) -> None:
    guide = cache.compile(S(regex="[0-9]{2}")).matcher(wait_for_reasoning=True)
    assert not guide.active
    assert feed(guide, "Let me think: the answer is words, not digits.")  # reasoning: anything goes
    assert guide.accept(TOK.think_end_id) and guide.active
    assert not guide.accept(TOK.encode("x")[0])  # now constrained
    guide = cache.compile(S(regex="[0-9]{2}")).matcher(wait_for_reasoning=True)
    assert guide.accept(TOK.think_end_id) and feed(guide, "42") and guide.accept(TOK.eos_id) and guide.terminated


@pytest.mark.parametrize("prompt, open_", [
    ("<｜User｜>hi<｜Assistant｜><think>", True),
    ("<｜User｜>hi<｜Assistant｜></think>", False),
    ("<｜User｜>hi<｜Assistant｜><think>I thought.</think>", False),
    ("plain text, no think tokens", False),
])
def test_reasoning_open_reads_the_prompts_last_think_token(prompt: str, open_: bool) -> None:
    assert reasoning_open(TOK.encode(prompt), TOK.think_start_id, TOK.think_end_id) is open_
