"""The offline API as a user calls it: `LLM(model).generate(...)` and the sampling options."""

from __future__ import annotations

import math

import pytest

from v4serve import LLM, SamplingParams
from v4serve.engine.llm_engine import RequestError


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM("tiny-v4-flash", block_size=32, kv_cache_memory=64 << 20, max_num_seqs=8, max_model_len=2048)


def test_generate_strings_and_token_lists(llm: LLM) -> None:
    outs = llm.generate(["Hello world", [5, 6, 7, 8]], SamplingParams(max_tokens=5, temperature=0))
    assert len(outs) == 2
    assert outs[0].prompt == "Hello world" and outs[0].prompt_token_ids == llm.tokenizer.encode("Hello world")
    assert outs[1].prompt is None and outs[1].prompt_token_ids == [5, 6, 7, 8]
    for o in outs:
        assert len(o.token_ids) <= 5 and o.outputs[0].finish_reason in ("length", "stop")
        assert o.text == llm.tokenizer.decode(o.token_ids, skip_special_tokens=True)


def test_presets_are_deterministic_models(llm: LLM) -> None:
    other = LLM("tiny-v4-flash", block_size=32, kv_cache_memory=64 << 20, max_num_seqs=2)
    sp = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    assert llm.generate([[1, 2, 3]], sp)[0].token_ids == other.generate([[1, 2, 3]], sp)[0].token_ids
    changed = LLM("tiny-v4-flash", seed=1, block_size=32, kv_cache_memory=64 << 20, max_num_seqs=2)
    assert changed.generate([[1, 2, 3]], sp)[0].token_ids != llm.generate([[1, 2, 3]], sp)[0].token_ids


def test_seeded_sampling_is_reproducible_and_n_gives_distinct_samples(llm: LLM) -> None:
    sp = SamplingParams(max_tokens=6, temperature=1.0, seed=7, ignore_eos=True)
    a = llm.generate([[10, 11, 12]], sp)[0].token_ids
    b = llm.generate([[99, 98], [10, 11, 12]], sp)[1].token_ids  # another batch composition
    assert a == b
    many = llm.generate([[10, 11, 12]], SamplingParams(n=3, max_tokens=6, temperature=1.0, seed=3, ignore_eos=True))[0]
    assert [o.index for o in many.outputs] == [0, 1, 2]
    assert len({tuple(o.token_ids) for o in many.outputs}) == 3


def test_stop_token_ids_min_tokens_and_max_tokens(llm: LLM) -> None:
    greedy = llm.generate([[3, 4, 5]], SamplingParams(max_tokens=10, temperature=0, ignore_eos=True))[0].token_ids
    stop_at = greedy[4]
    first = greedy.index(stop_at)
    out = llm.generate([[3, 4, 5]], SamplingParams(max_tokens=10, temperature=0, stop_token_ids=[stop_at]))[0]
    assert out.token_ids == greedy[: first + 1]
    assert out.outputs[0].finish_reason == "stop" and out.outputs[0].stop_reason == stop_at
    late = llm.generate([[3, 4, 5]], SamplingParams(max_tokens=10, temperature=0, stop_token_ids=[stop_at],
                                                    min_tokens=first + 2))[0]
    assert len(late.token_ids) >= first + 2


def test_stop_strings_cut_the_text(llm: LLM) -> None:
    full = llm.generate([[7, 8, 9]], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))[0]
    text = full.text
    assert len(text) > 4
    stop = text[2:4]
    out = llm.generate([[7, 8, 9]], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, stop=[stop]))[0]
    assert out.outputs[0].finish_reason == "stop" and out.outputs[0].stop_reason == stop
    assert out.text == text[: text.index(stop)]
    keep = llm.generate([[7, 8, 9]], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, stop=[stop],
                                                    include_stop_str_in_output=True))[0]
    assert keep.text == text[: text.index(stop) + len(stop)]


def test_logprobs_and_prompt_logprobs(llm: LLM) -> None:
    out = llm.generate([[20, 21, 22, 23]], SamplingParams(max_tokens=4, temperature=0, logprobs=3,
                                                           prompt_logprobs=2, ignore_eos=True))[0]
    lps = out.outputs[0].logprobs
    assert len(lps) == 4
    for tok, entry in zip(out.token_ids, lps):
        assert tok in entry and len(entry) >= 3
        assert entry[tok] == max(entry.values())  # greedy picks the most likely token
        assert all(v <= 0 for v in entry.values())
    plp = out.prompt_logprobs
    assert plp[0] is None and len(plp) == 4
    for tok, entry in zip([21, 22, 23], plp[1:]):
        assert tok in entry and math.isfinite(entry[tok])


def test_bad_requests_are_refused_with_a_reason(llm: LLM) -> None:
    with pytest.raises(RequestError, match="empty"):
        llm.generate([[]], SamplingParams(max_tokens=2))
    with pytest.raises(RequestError, match="context"):
        llm.generate([[1] * 2100], SamplingParams(max_tokens=2))
    with pytest.raises(RequestError, match="max_tokens"):
        llm.generate([[1, 2]], SamplingParams(max_tokens=5000))
    with pytest.raises(RequestError, match="vocabulary"):
        llm.generate([[1, 10**7]], SamplingParams(max_tokens=2))
    with pytest.raises(RequestError, match="temperature"):
        llm.generate([[1, 2]], SamplingParams(max_tokens=2, temperature=-1))
    # the engine keeps serving after refusals
    assert len(llm.generate([[1, 2]], SamplingParams(max_tokens=2))[0].token_ids) <= 2


def test_engine_options_are_llm_keywords() -> None:
    from v4serve.engine.config import EngineConfigError

    llm = LLM("tiny-v4-flash", enable_prefix_caching=False, max_num_seqs=3, kv_cache_memory=32 << 20)
    assert llm.engine.cfg.max_num_seqs == 3 and not llm.engine.cfg.enable_prefix_caching
    with pytest.raises(EngineConfigError, match="unknown engine option"):
        LLM("tiny-v4-flash", max_num_sequences=3)
    with pytest.raises(EngineConfigError, match="--block-size"):
        LLM("tiny-v4-flash", block_size=7)
