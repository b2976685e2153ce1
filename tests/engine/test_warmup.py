"""The start-up warm-up (engine/warmup.py) runs its workload and leaves the engine as a fresh one."""

from __future__ import annotations

import pytest

from v4serve.engine.config import EngineConfig
from v4serve.engine.llm_engine import LLMEngine
from v4serve.engine.sampling_params import SamplingParams
from v4serve.engine.warmup import warm_up

from .common import ENGINE

BLOCK = 32


def _engine(preset: str) -> LLMEngine:
    return LLMEngine(preset, EngineConfig(**ENGINE, block_size=BLOCK, max_num_seqs=8, max_model_len=320,
                                          max_num_batched_tokens=96, target_itl_ms=50.0, kv_cache_memory=64 << 20,
                                          decode_steps_between_prefills=20))


def _greedy(eng: LLMEngine, prompt: list[int], n: int) -> list[int]:
    (rid,) = eng.add_request(prompt, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
    out: list[int] = []
    while eng.has_unfinished():
        for d in eng.step():
            out += d.new_token_ids
    eng.release(rid)
    return out


@pytest.mark.parametrize("preset", ["tiny-v4-flash", "tiny-v41-flash"])
def test_warm_up_leaves_a_fresh_engine(preset: str) -> None:
    prompt = list(range(1000, 1000 + 70))
    want = _greedy(_engine(preset), prompt, 6)
    eng = _engine(preset)
    fresh = eng.stats()
    step, tokens = eng.step, []

    def counted_step():  # the token count of every step the warm-up runs
        out = step()
        tokens.append(eng.last_step_tokens)
        return out

    eng.step = counted_step
    report = warm_up(eng, lengths=(1, 7, 40), decoders=3, singles=(2, 7, 12))
    del eng.step
    # the decoding row, 3 prompts one at a time, 3 lengths and the chunk limit (96), 3 decoders, 1 prompt (600 cut to
    # 312); then a decoding row and the follow-ups that fit max_model_len 320 on an earlier prompt of two blocks or
    # more: 5, 100 and 16 new tokens on the 96-token prompt (300 fits on none), each a prefix-cache hit
    assert report.requests == 1 + 3 + 4 + 3 + 1 + 1 + 3
    # each single prompt has a step of its own beside the decoding row (the prefill gate, which would hold them back
    # for 20 decode steps, is off during the warm-up and back on after it)
    assert {3, 8, 13} <= set(tokens), tokens
    assert eng.scheduler.prefill_gate.every == 20
    assert report.prefix_hits >= 3 and report.steps > 10
    assert not eng.has_unfinished() and not eng.requests and not eng.outputs
    stats = eng.stats()
    for key in ("blocks_used", "blocks_cached", "checkpoints", "prefix_hits", "prefix_misses", "prompt_tokens",
                "cached_tokens", "preemptions", "evictions", "running", "waiting"):
        assert stats[key] == fresh[key] == 0, key
    budget = eng.scheduler.prefill_budget
    assert budget.target == 0.05 and budget.decode_s is None and budget.per_token_s is None
    assert eng.scheduler.prefill_gate.decode_only_steps == 0 and eng.last_step_tokens == eng.last_step_rows == 0
    # what a request gets afterwards does not depend on the warm-up
    assert _greedy(eng, prompt, 6) == want
