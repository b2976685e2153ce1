"""The real server (tiny random-weight V4 model, CPU) driven by the official `openai` client.

Random weights give random text: these tests assert structure and invariants (usage arithmetic, cache hits,
tool-call shape, no markup), never content.
"""

from __future__ import annotations

import json

import openai
import pytest

MARKUP = ("｜DSML｜", "<｜", "</think>", "<think>")
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
SYSTEM = ("You are a careful coding agent working in a large repository. " +
          " ".join(f"File src/module_{i}.py defines class Widget{i} with methods build, check and render." for i in
                   range(14)))


@pytest.fixture(scope="module")
def client(tiny_server_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=tiny_server_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def no_markup(text: str | None) -> bool:
    return not any(m in (text or "") for m in MARKUP)


def test_models(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == ["tiny-v4-flash"]


def test_chat_usage_and_shape(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="tiny-v4-flash", messages=[{"role": "user", "content": "Hello"}],
                                       max_tokens=6, temperature=0, extra_body={"top_k": 5, "ignore_eos": True})
    choice = r.choices[0]
    assert choice.finish_reason == "length" and choice.message.role == "assistant"
    assert no_markup(choice.message.content)
    u = r.usage
    assert u.completion_tokens == 6 and u.prompt_tokens > 0 and u.total_tokens == u.prompt_tokens + 6
    assert u.prompt_tokens_details.cached_tokens == 0  # shorter than one block
    assert u.completion_tokens_details.reasoning_tokens == 0


def test_chat_streaming_with_usage_and_n(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="tiny-v4-flash", messages=[{"role": "user", "content": "Count"}], max_tokens=5, n=2, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        seed=11)  # a fixed seed: the random model's sampled text (checked for markup below) is the same every run
    chunks = list(stream)
    text = {0: "", 1: ""}
    finish = {}
    for ch in chunks[:-1]:
        assert ch.usage is None
        for c in ch.choices:
            text[c.index] += c.delta.content or ""
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    assert finish == {0: "length", 1: "length"}
    assert all(no_markup(t) for t in text.values())
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == 10


def test_thinking_goes_to_reasoning_content(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="tiny-v4-flash", messages=[{"role": "user", "content": "Why?"}],
                                       max_tokens=8, seed=11, extra_body={"chat_template_kwargs": {"thinking": True},
                                                                          "ignore_eos": True})
    msg = r.choices[0].message
    reasoning = msg.model_extra.get("reasoning_content")
    assert isinstance(reasoning, str) and no_markup(reasoning) and no_markup(msg.content)
    details = r.usage.completion_tokens_details
    assert 0 < details.reasoning_tokens <= r.usage.completion_tokens


def test_forced_tool_call(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="tiny-v4-flash", messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, max_tokens=8, temperature=0)
    msg = r.choices[0].message
    assert msg.tool_calls and msg.tool_calls[0].function.name == "get_weather"
    assert msg.tool_calls[0].id and msg.tool_calls[0].type == "function"
    assert isinstance(json.loads(msg.tool_calls[0].function.arguments), dict)
    assert no_markup(msg.content) and no_markup(msg.tool_calls[0].function.arguments)


def test_forced_tool_call_streaming(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="tiny-v4-flash", messages=[{"role": "user", "content": "Weather?"}], tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, max_tokens=6, stream=True,
        stream_options={"include_usage": True}, temperature=0)  # greedy: the random model's own text is fixed
    names, args, content = [], "", ""
    for ch in stream:
        for c in ch.choices:
            content += c.delta.content or ""
            for tc in c.delta.tool_calls or []:
                if tc.function and tc.function.name:
                    names.append(tc.function.name)
                args += (tc.function.arguments or "") if tc.function else ""
    assert names == ["get_weather"]
    assert isinstance(json.loads(args), dict) and no_markup(content) and no_markup(args)


def test_tool_choice_required_and_none_leak_no_markup(client: openai.OpenAI) -> None:
    for choice in ("required", "none", "auto"):
        r = client.chat.completions.create(model="tiny-v4-flash", tools=[WEATHER], tool_choice=choice,
                                           messages=[{"role": "user", "content": "Hi"}], max_tokens=6, seed=11)
        msg = r.choices[0].message
        assert no_markup(msg.content)
        for tc in msg.tool_calls or []:
            assert choice != "none" and no_markup(tc.function.arguments)


def test_cached_tokens_on_a_repeated_multi_turn_conversation(client: openai.OpenAI) -> None:
    turn1 = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Which widget renders?"}]
    salt = {"cache_salt": "e2e-cache"}
    r1 = client.chat.completions.create(model="tiny-v4-flash", messages=turn1, max_tokens=4,
                                        extra_body={**salt, "ignore_eos": True})
    assert r1.usage.prompt_tokens > 200
    assert r1.usage.prompt_tokens_details.cached_tokens == 0
    again = client.chat.completions.create(model="tiny-v4-flash", messages=turn1, max_tokens=4, extra_body=salt)
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached <= again.usage.prompt_tokens
    turn2 = turn1 + [{"role": "assistant", "content": r1.choices[0].message.content or ""},
                     {"role": "user", "content": "And which one checks?"}]
    r2 = client.chat.completions.create(model="tiny-v4-flash", messages=turn2, max_tokens=4, extra_body=salt)
    assert r2.usage.prompt_tokens > r1.usage.prompt_tokens
    assert r2.usage.prompt_tokens_details.cached_tokens >= 64
    other = client.chat.completions.create(model="tiny-v4-flash", messages=turn1, max_tokens=2,
                                           extra_body={"cache_salt": "someone-else"})
    assert other.usage.prompt_tokens_details.cached_tokens == 0  # the salt isolates caches


def test_completions(client: openai.OpenAI) -> None:
    r = client.completions.create(model="tiny-v4-flash", prompt=["Once upon", "a time"], max_tokens=3,
                                  logprobs=2, extra_body={"ignore_eos": True})
    assert [c.index for c in r.choices] == [0, 1]
    assert all(len(c.logprobs.tokens) == 3 for c in r.choices)
    assert r.usage.completion_tokens == 6
    stream = client.completions.create(model="tiny-v4-flash", prompt="Hello", max_tokens=3, stream=True,
                                       stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        seed=11)  # a fixed seed: the random model's sampled text (checked for markup below) is the same every run
    chunks = list(stream)
    assert chunks[-1].usage.completion_tokens == 3
    assert [c.choices[0].finish_reason for c in chunks[:-1]][-1] == "length"


def test_errors_raise_bad_request(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    assert e.value.body["code"] == "model_not_found" and e.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny-v4-flash", messages=[{"role": "user", "content": "x"}],
                                       max_tokens=5000)
    assert e.value.body["param"] == "max_tokens" and "4096" in e.value.body["message"]


def test_engine_timed_vllm_metrics(client: openai.OpenAI, tiny_server_url: str) -> None:
    """vLLM's engine-timed series: queue, prefill and inference time per request, and tokens per engine step."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    client.chat.completions.create(model="tiny-v4-flash", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    with urllib.request.urlopen(tiny_server_url + "/metrics") as r:
        text = r.read().decode()
    samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    for hist in ("request_queue_time_seconds", "request_prefill_time_seconds", "request_inference_time_seconds",
                 "iteration_tokens_total"):
        assert samples[f"v4serve:{hist}_count"] >= 1, hist
    assert samples["v4serve:request_inference_time_seconds_sum"] > 0
    assert samples["v4serve:iteration_tokens_total_sum"] >= 3  # at least the prompt chunk and the decodes
