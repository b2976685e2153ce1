"""SamplingParams: vLLM-compatible defaults and validation errors that name the field."""

from __future__ import annotations

import pytest

from v4serve.engine.sampling_params import SamplingParams, SamplingParamsError

VOCAB = 129280


def test_defaults_match_vllm() -> None:
    p = SamplingParams()
    assert (p.n, p.max_tokens, p.min_tokens) == (1, 16, 0)
    assert (p.temperature, p.top_p, p.top_k, p.min_p, p.seed) == (1.0, 1.0, 0, 0.0, None)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.0, 0.0, 1.0)
    assert p.stop == [] and p.stop_token_ids == [] and not p.ignore_eos
    assert p.logprobs is None and p.prompt_logprobs is None
    assert p.skip_special_tokens and not p.include_stop_str_in_output
    p.validate(VOCAB)


def test_stop_accepts_a_single_string_or_none() -> None:
    assert SamplingParams(stop="\n").stop == ["\n"]
    assert SamplingParams(stop=None).stop == []  # type: ignore[arg-type]
    assert SamplingParams(stop=("a", "b")).stop == ["a", "b"]  # type: ignore[arg-type]


def test_defaults_are_not_shared_between_instances() -> None:
    a, b = SamplingParams(), SamplingParams()
    a.stop.append("x")
    assert b.stop == []


def test_derived_facts() -> None:
    assert SamplingParams(temperature=0.0).greedy and not SamplingParams(temperature=0.5).greedy
    assert SamplingParams(top_k=-1).effective_top_k == 0 == SamplingParams(top_k=0).effective_top_k
    assert SamplingParams(stop_token_ids=[7]).stop_ids(eos_id=1) == {1, 7}
    assert SamplingParams(stop_token_ids=[7], ignore_eos=True).stop_ids(eos_id=1) == {7}
    assert SamplingParams(presence_penalty=0.1).uses_penalties and not SamplingParams().uses_penalties
    assert SamplingParams(min_p=0.1).uses_truncation and not SamplingParams().uses_truncation


@pytest.mark.parametrize(
    "field, value, allowed",
    [
        ("n", 0, ">= 1"),
        ("max_tokens", 0, ">= 1"),
        ("min_tokens", -1, ">= 0"),
        ("temperature", -0.1, ">= 0"),
        ("temperature", float("nan"), ">= 0"),
        ("temperature", float("inf"), ">= 0"),
        ("top_p", 0.0, "(0, 1]"),
        ("top_p", 1.01, "(0, 1]"),
        ("top_k", -2, ">= 1"),
        ("min_p", 1.5, "[0, 1]"),
        ("presence_penalty", 2.5, "[-2, 2]"),
        ("frequency_penalty", -3.0, "[-2, 2]"),
        ("repetition_penalty", 0.0, "> 0"),
        ("logprobs", 21, "[0, 20]"),
        ("logprobs", -1, "[0, 20]"),
        ("prompt_logprobs", 50, "[0, 20]"),
        ("seed", 1.5, "integer"),
        ("stop", [""], "non-empty"),
        ("stop_token_ids", [VOCAB], f"[0, {VOCAB})"),
        ("stop_token_ids", [-1], f"[0, {VOCAB})"),
    ],
)
def test_invalid_values_name_field_and_range(field: str, value: object, allowed: str) -> None:
    params = SamplingParams(**{field: value})
    with pytest.raises(SamplingParamsError) as info:
        params.validate(VOCAB)
    assert info.value.field == field
    assert field in str(info.value) and allowed in str(info.value)
    assert isinstance(info.value, ValueError)  # servers map ValueError to HTTP 400


def test_min_tokens_cannot_exceed_max_tokens() -> None:
    with pytest.raises(SamplingParamsError, match="min_tokens.*max_tokens"):
        SamplingParams(min_tokens=20, max_tokens=10).validate(VOCAB)
    SamplingParams(min_tokens=10, max_tokens=10).validate(VOCAB)
    SamplingParams(min_tokens=100, max_tokens=None).validate(VOCAB)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": 0.0},
        {"top_k": -1},
        {"top_k": 1, "top_p": 1e-3, "min_p": 1.0},
        {"logprobs": 0, "prompt_logprobs": 20},
        {"seed": -5},
        {"presence_penalty": -2.0, "frequency_penalty": 2.0, "repetition_penalty": 1.3},
        {"stop": ["</s>", "\n\n"], "stop_token_ids": [0, VOCAB - 1]},
    ],
)
def test_valid_edge_values_are_accepted(kwargs: dict) -> None:
    SamplingParams(**kwargs).validate(VOCAB)
