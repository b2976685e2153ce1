"""Structured output through the engine (offline API, tiny random-weight model): only the grammar makes the output
valid, so every check here fails if the constraint is not enforced."""

from __future__ import annotations

import json
from concurrent.futures import Future

import jsonschema
import pytest
import torch

from v4serve import LLM, SamplingParams
from v4serve.engine.sampling_params import StructuredOutputsParams as S

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "pet": {"type": "string", "enum": ["cat", "dog"]}, "ok": {"type": "boolean"}},
          "required": ["name", "age", "pet", "ok"], "additionalProperties": False}


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM("tiny-v4-flash", block_size=32, kv_cache_memory=64 << 20, max_num_seqs=8, max_model_len=2048)


def gen(llm: LLM, spec: S, n: int = 1, prompt: str | list[int] = "Hello", **kw) -> list:
    params = [SamplingParams(max_tokens=kw.pop("max_tokens", 200), seed=i, structured_outputs=spec, **kw)
              for i in range(n)]
    return [o.outputs[0] for o in llm.generate([prompt] * n, params)]


def test_json_schema_outputs_validate_and_stop(llm: LLM) -> None:
    for out in gen(llm, S(json=json.dumps(SCHEMA)), n=4):
        assert out.finish_reason == "stop", out.text
        jsonschema.validate(json.loads(out.text), SCHEMA)


def test_regex_and_choice(llm: LLM) -> None:
    import re

    for out in gen(llm, S(regex=r"[a-z]{3}-[0-9]{2}"), n=3):
        assert out.finish_reason == "stop" and re.fullmatch(r"[a-z]{3}-[0-9]{2}", out.text)
    for out in gen(llm, S(choice=("red", "green", "blue")), n=3):
        assert out.finish_reason == "stop" and out.text in ("red", "green", "blue")


def test_a_complete_grammar_ends_the_request_despite_ignore_eos_and_min_tokens(llm: LLM) -> None:
    (out,) = gen(llm, S(choice=("yes", "no")), ignore_eos=True, min_tokens=50)
    assert out.finish_reason == "stop" and out.text in ("yes", "no")


def test_max_tokens_cuts_a_grammar_short(llm: LLM) -> None:
    (out,) = gen(llm, S(regex=r"[0-9]{40}"), max_tokens=3)
    assert out.finish_reason == "length" and out.text.isdigit() and len(out.token_ids) == 3


def test_a_grammar_that_does_not_compile_fails_its_request_only(llm: LLM) -> None:
    with pytest.raises(RuntimeError, match="structured_outputs.grammar"):
        llm.generate(["Hi"], SamplingParams(max_tokens=5, structured_outputs=S(grammar="root ::= undefined_rule")))
    assert llm.generate(["Hi"], SamplingParams(max_tokens=2, ignore_eos=True))[0].outputs[0].finish_reason == "length"


def test_the_constraint_starts_after_the_reasoning(llm: LLM) -> None:
    """The prompt opens `<think>`; a scripted model ends its reasoning after 4 tokens (the logits tap forces
    `</think>`): the reasoning is free text, the rest follows the grammar."""
    tok, forced_at = llm.tokenizer, 4

    def end_reasoning(sched, logits: torch.Tensor, _: list[int]) -> None:
        for row, req in enumerate(r.request for r in sched.rows):
            if len(req.output_token_ids) == forced_at:
                logits[row, tok.think_end_id] = 1e4

    prompt = tok.encode("<｜begin▁of▁sentence｜><｜User｜>Count<｜Assistant｜><think>")
    llm.engine.runner.logits_tap = end_reasoning
    try:
        outs = gen(llm, S(regex=r"[0-9]{5}"), n=3, prompt=prompt, skip_special_tokens=False)
    finally:
        llm.engine.runner.logits_tap = None
    for out in outs:
        assert out.token_ids[forced_at] == tok.think_end_id and out.finish_reason == "stop"
        answer = tok.decode(out.token_ids[forced_at + 1:-1])
        assert answer.isdigit() and len(answer) == 5
    assert not all(tok.decode(o.token_ids[:forced_at]).isdigit() for o in outs)  # reasoning was not constrained
    # without the scripted end, a reasoning prompt is not constrained at all
    (free,) = gen(llm, S(regex=r"[0-9]{5}"), prompt=prompt, max_tokens=6, ignore_eos=True)
    assert free.finish_reason == "length" and not free.text.isdigit()


def test_a_request_whose_grammar_is_compiling_does_not_hold_up_the_queue(llm: LLM) -> None:
    engine = llm.engine
    real_submit = engine.grammars._submit
    held: Future = Future()
    engine.grammars._submit = lambda spec: held  # type: ignore[method-assign]
    try:
        (slow,) = engine.add_request([5, 6, 7], SamplingParams(max_tokens=3, structured_outputs=S(regex="[ab]+")))
        (fast,) = engine.add_request([8, 9], SamplingParams(max_tokens=2, ignore_eos=True))
        finished: set[str] = set()
        for _ in range(5):
            finished |= {d.request_id for d in engine.step() if d.finished}
        assert fast in finished and slow not in finished
        assert engine.requests[slow].num_computed == 0  # still queued, never admitted
        held.set_result(real_submit(S(regex="[ab]+")).result())
        while engine.has_unfinished():
            finished |= {d.request_id for d in engine.step() if d.finished}
        text = llm.tokenizer.decode(engine.requests[slow].output_token_ids, skip_special_tokens=True)
        assert slow in finished and set(text) <= {"a", "b"} and text
    finally:
        engine.grammars._submit = real_submit  # type: ignore[method-assign]
        engine.release(slow), engine.release(fast)
