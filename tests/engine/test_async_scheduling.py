"""Async scheduling (`--async-scheduling`, engine/async_steps.py): each step is launched before the previous step's
tokens are read, the rows whose token is pending fed from the device. The outputs must be the synchronous engine's,
token for token, through chunked prefill, preemption (a tiny KV pool), prefix hits, seeded sampling, stops, aborts and
a request that makes the engine step synchronously for a while; no block or slot may leak."""

from __future__ import annotations

import pytest

from v4serve import SamplingParams
from v4serve.engine import async_steps
from v4serve.engine.config import EngineConfig
from v4serve.engine.llm_engine import LLMEngine
from v4serve.engine.request import FinishReason

from .common import ENGINE
from .test_engine_batching import BLOCK, assert_all_blocks_free, pool_bytes, workload

PRESETS = ["tiny-v4-flash", "tiny-v41-flash"]  # V4.1: Engram's history (the tokens before each input) is on the host


def _engine(asynchronous: bool, blocks: int = 16, preset: str = "tiny-v4-flash") -> LLMEngine:
    cfg = EngineConfig(block_size=BLOCK, max_num_seqs=7, kv_cache_memory=pool_bytes(preset, blocks, 14),
                       max_num_batched_tokens=96, long_prefill_token_threshold=40, async_scheduling=asynchronous,
                       **ENGINE)
    return LLMEngine(preset, cfg)


def _params(i: int) -> SamplingParams:
    if i % 3 == 1:  # seeded sampling: the noise depends on (seed, output length), which the placeholder keeps
        return SamplingParams(max_tokens=6 + i, temperature=0.8, seed=100 + i, ignore_eos=True)
    return SamplingParams(max_tokens=6 + i, temperature=0, ignore_eos=True)


def _run(eng: LLMEngine, prompts: list[list[int]], late: dict[int, SamplingParams] | None = None,
         abort_at: dict[int, int] | None = None) -> tuple[list[str], dict[str, list]]:
    """Run to the end; `late` adds requests at given steps, `abort_at` aborts request i at a step. Returns the ids and
    each request's streamed token ids (from the deltas)."""
    ids = [eng.add_request(p, _params(i))[0] for i, p in enumerate(prompts)]
    streamed: dict[str, list] = {rid: [] for rid in ids}
    step = 0
    while eng.has_unfinished() or (late and any(s > step for s in late)):
        for s, params in (late or {}).items():
            if s == step:
                rid = eng.add_request(prompts[0][:20], params)[0]
                ids.append(rid)
                streamed[rid] = []
        for i, s in (abort_at or {}).items():
            if s == step:
                eng.abort(ids[i])
        for d in eng.step():
            streamed[d.request_id] += d.new_token_ids
            if d.finished:
                assert d.num_output_tokens == len(eng.requests[d.request_id].output_token_ids)
        step += 1
    return ids, streamed


@pytest.mark.parametrize("preset", PRESETS)
def test_async_steps_give_the_synchronous_outputs(preset: str) -> None:
    prompts = workload(3)
    sync = _engine(False, preset=preset)
    ids_s, streamed_s = _run(sync, prompts)
    eng = _engine(True, preset=preset)
    assert eng._async
    ids_a, streamed_a = _run(eng, prompts)
    if preset == "tiny-v4-flash":  # (tiny-v41-flash's 7 requests fit even 3 blocks: no preemption there)
        assert eng.scheduler.num_preemptions > 0, "the tiny pool was meant to force preemption"
    for a, s in zip(ids_a, ids_s):
        ra, rs = eng.requests[a], sync.requests[s]
        assert ra.output_token_ids == rs.output_token_ids
        assert ra.finish_reason == rs.finish_reason == FinishReason.LENGTH
        assert streamed_a[a] == ra.output_token_ids and not ra.pending_token
    assert_all_blocks_free(eng)


def test_aborts_and_a_logprobs_request_mid_stream() -> None:
    """A request asking for logprobs arrives mid-run: the engine drains the launched step and steps synchronously
    until it ends, then goes on asynchronously; an abort while a token is pending drops the placeholder."""
    prompts = workload(4)[:5]
    late = {4: SamplingParams(max_tokens=3, temperature=0, logprobs=2)}
    sync = _engine(False, blocks=64)
    ids_s, _ = _run(sync, prompts, late, abort_at={2: 6})
    eng = _engine(True, blocks=64)
    ids_a, streamed = _run(eng, prompts, late, abort_at={2: 6})
    for i, (a, s) in enumerate(zip(ids_a, ids_s)):
        ra, rs = eng.requests[a], sync.requests[s]
        assert not ra.pending_token and streamed[a] == ra.output_token_ids
        if i == 2:
            assert ra.finish_reason == FinishReason.ABORT
            continue
        assert ra.output_token_ids == rs.output_token_ids and ra.finish_reason == rs.finish_reason
    assert len(eng.requests[ids_a[-1]].logprobs) == 3
    assert_all_blocks_free(eng)


def test_which_requests_step_synchronously() -> None:
    from v4serve.engine.request import Request

    def req(**kw) -> Request:
        return Request("r", [1, 2, 3], SamplingParams(**kw))

    assert async_steps.eligible([req(), req(temperature=0.7, seed=1), req(stop=["x"])])
    for kw in ({"logprobs": 1}, {"prompt_logprobs": 1}, {"repetition_penalty": 1.1}, {"presence_penalty": 0.5},
               {"frequency_penalty": 0.5}):
        assert not async_steps.eligible([req(), req(**kw)]), kw
    done = req(logprobs=1)
    done.status = done.status.FINISHED
    assert async_steps.eligible([req(), done])


@pytest.mark.parametrize("flags,on", [([], True), (["--async-scheduling"], True), (["--no-async-scheduling"], False)])
def test_the_flag(flags: list[str], on: bool) -> None:
    """On by default (the graphed step is faster with it); --no-async-scheduling steps synchronously."""
    from v4serve.cli import build_parser
    from v4serve.engine.config import EngineConfig

    args = build_parser().parse_args(["serve", "tiny-v4-flash"] + flags)
    assert args.async_scheduling is on
    assert EngineConfig().async_scheduling
