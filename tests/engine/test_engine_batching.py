"""The engine batches many requests without changing any of them.

Greedy outputs of a mixed workload (different lengths, shared prefixes, aborts, preemption forced by a tiny KV pool)
must equal, token for token, what each request gets when it runs alone in a fresh engine with no prefix cache.
"""

from __future__ import annotations

import random

import pytest
import torch

from v4serve import LLM, SamplingParams
from v4serve.cache.spec import make_cache_spec
from v4serve.engine.llm_engine import LLMEngine
from v4serve.engine.request import FinishReason
from v4serve.presets import get_preset

from .common import ENGINE

BLOCK = 32


def pool_bytes(preset: str, blocks: int, slots: int, kv_dtype: str = "auto") -> int:
    """KV memory that gives exactly `blocks` blocks and `slots` slots (the engine's capacity formula)."""
    spec = make_cache_spec(get_preset(preset), BLOCK, kv_dtype, None, torch.float64)
    return (slots + 1) * spec.slot_bytes() + (blocks + 1) * spec.block_bytes()


def workload(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    shared = [rng.randrange(1000, 100000) for _ in range(100)]
    prompts = [[rng.randrange(1000, 100000) for _ in range(n)] for n in (5, 37, 64, 150)]
    prompts += [shared + [rng.randrange(1000, 100000) for _ in range(n)] for n in (3, 40)]
    prompts.append(shared[:70])
    return prompts


def run_alone(preset: str, prompt: list[int], max_tokens: int) -> list[int]:
    llm = _single(preset)
    return llm.generate([prompt], SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))[0].token_ids


_singles: dict[str, LLM] = {}


def _single(preset: str) -> LLM:
    if preset not in _singles:
        _singles[preset] = LLM(preset, block_size=BLOCK, max_num_seqs=1, enable_prefix_caching=False,
                               kv_cache_memory=pool_bytes(preset, 64, 1), **ENGINE)
    return _singles[preset]


@pytest.mark.parametrize("preset", ["tiny-v4-flash", "tiny-v4-pro"])
def test_mixed_workload_equals_one_at_a_time(preset: str) -> None:
    prompts = workload(1)
    max_tokens = 12
    expected = [run_alone(preset, p, max_tokens) for p in prompts]
    # 16 blocks of 32 positions cannot hold all 7 requests at once (they need 24): the scheduler must preempt
    eng = LLMEngine(preset, _cfg(max_num_seqs=7, kv_cache_memory=pool_bytes(preset, 16, 7 * 2),
                                 max_num_batched_tokens=96, long_prefill_token_threshold=40))
    ids = [eng.add_request(p, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))[0]
           for p in prompts]
    aborted = {ids[2]}
    steps = 0
    while eng.has_unfinished():
        eng.step()
        steps += 1
        if steps == 5:
            eng.abort(ids[2])
    assert eng.scheduler.num_preemptions > 0, "the tiny pool was meant to force preemption"
    for rid, exp in zip(ids, expected):
        req = eng.requests[rid]
        if rid in aborted:
            assert req.finish_reason == FinishReason.ABORT
            assert len(req.output_token_ids) < max_tokens
            continue
        assert req.finish_reason == FinishReason.LENGTH
        assert req.output_token_ids == exp, f"request {rid} diverged from its solo run"
    assert_all_blocks_free(eng)


def _cfg(**kw):
    from v4serve.engine.config import EngineConfig

    return EngineConfig(block_size=BLOCK, **ENGINE, **kw)


def assert_all_blocks_free(eng: LLMEngine) -> None:
    pool = eng.kv.pool
    assert all(r == 0 for r in pool.ref), "a block is still referenced after every request ended"
    assert pool.num_free == pool.num_blocks, "every block must be free or a cached (evictable) prefix"
    assert len(eng.kv.free_slots) == eng.cfg.max_num_seqs


def test_prefix_hits_and_shared_prefix_requests_match_cold_runs() -> None:
    preset = "tiny-v4-flash"
    prompts = workload(2)
    eng = LLMEngine(preset, _cfg(max_num_seqs=4, kv_cache_memory=pool_bytes(preset, 200, 8)))
    sp = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    first = []
    for p in prompts[4:6]:  # two requests sharing a 100-token prefix, one after the other
        rid = eng.add_request(p, sp)[0]
        while eng.has_unfinished():
            eng.step()
        first.append(eng.requests[rid])
    assert first[1].num_cached_tokens > 0, "the second request shares 100 tokens with the first"
    for req, p in zip(first, prompts[4:6]):
        assert req.output_token_ids == run_alone(preset, p, 6)
    assert_all_blocks_free(eng)


def test_capacity_matches_formula() -> None:
    preset = "tiny-v4-flash"
    spec = make_cache_spec(get_preset(preset), BLOCK, "auto", None, torch.float64)
    budget = 64 << 20
    eng = LLMEngine(preset, _cfg(max_num_seqs=8, kv_cache_memory=budget))
    slots = eng.capacity.num_slots
    assert slots == 8 + 8  # running slots + one window checkpoint per running slot by default
    assert eng.capacity.num_blocks == (budget - (slots + 1) * spec.slot_bytes()) // spec.block_bytes() - 1
    assert eng.pools.nbytes <= budget
    text = eng.describe_capacity()
    assert f"{eng.capacity.num_blocks} blocks" in text and "AgentX" in text


def test_decode_rows_are_never_starved_by_a_long_prefill() -> None:
    preset = "tiny-v4-flash"
    eng = LLMEngine(preset, _cfg(max_num_seqs=4, max_num_batched_tokens=48, long_prefill_token_threshold=32,
                                 kv_cache_memory=pool_bytes(preset, 100, 8)))
    sp = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    short = eng.add_request(list(range(1000, 1010)), sp)[0]
    eng.step()  # the short prompt is prefilled and starts decoding
    long = eng.add_request(list(range(2000, 2600)), sp)[0]
    produced = []
    while not eng.requests[long].output_token_ids:
        before = len(eng.requests[short].output_token_ids)
        out = eng.scheduler.schedule()
        assert out.num_tokens <= 48
        long_rows = [r for r in out.rows if r.request.request_id == long]
        assert all(r.num_tokens <= 32 for r in long_rows), "a prefill chunk exceeded the per-request cap"
        res = eng.runner.execute(out, eng.scheduler.decoder_floor)
        eng.scheduler.advance(out)
        for s in res.sampled:
            eng.outputs[s.request.request_id].append(s.token_id, s.top)
        produced.append(len(eng.requests[short].output_token_ids) - before)
        if eng.requests[short].is_finished or len(eng.requests[short].output_token_ids) >= 40:
            break
    assert produced and all(n == 1 for n in produced), "the decoding request must advance every step"


def test_a_request_alone_takes_the_whole_budget_others_the_quarter_cap() -> None:
    """Without --long-prefill-token-threshold a prompt is capped at a quarter of the budget per step so that it cannot
    hold back other requests; alone in the engine it takes the whole budget (nothing to hold back). Given the
    threshold, it is the cap either way. (Chunk ends land on 32-position block boundaries here: window checkpoints;
    a prompt's last chunk stops at its last boundary first.)"""
    preset = "tiny-v4-flash"
    sp = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
    eng = LLMEngine(preset, _cfg(max_num_seqs=4, max_num_batched_tokens=96, kv_cache_memory=pool_bytes(preset, 100, 8)))
    alone = eng.add_request(list(range(1000, 1090)), sp)[0]
    out = eng.scheduler.schedule()
    assert [(r.request.request_id, r.num_tokens) for r in out.rows] == [(alone, 64)]  # 90 to its last boundary
    eng.abort(alone)  # (scheduled, not run: its blocks go back)
    a = eng.add_request(list(range(2000, 2090)), sp)[0]
    b = eng.add_request(list(range(3000, 3090)), sp)[0]
    out = eng.scheduler.schedule()
    assert [(r.request.request_id, r.num_tokens) for r in out.rows] == [(a, 24), (b, 24)]
    capped = LLMEngine(preset, _cfg(max_num_seqs=4, max_num_batched_tokens=96, long_prefill_token_threshold=40,
                                    kv_cache_memory=pool_bytes(preset, 100, 8)))
    one = capped.add_request(list(range(1000, 1090)), sp)[0]
    assert [(r.request.request_id, r.num_tokens) for r in capped.scheduler.schedule().rows] == [(one, 32)]  # 40
