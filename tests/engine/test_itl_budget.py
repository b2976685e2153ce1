"""The prefill budget beside decodes (engine/itl_budget.py): a fixed cap or one derived from an inter-token-latency
target, applied by the scheduler only to steps that also decode."""

from __future__ import annotations

import pytest
import torch

from v4serve.engine.config import EngineConfig, EngineConfigError
from v4serve.engine.itl_budget import PrefillBudget
from v4serve.engine.llm_engine import LLMEngine
from v4serve.engine.sampling_params import SamplingParams


def test_fixed_cap_and_no_cap() -> None:
    assert PrefillBudget().tokens() is None and not PrefillBudget().active
    assert PrefillBudget(fixed=300, minimum=64).tokens() == 300
    assert PrefillBudget(fixed=10, minimum=64).tokens() == 64  # prefills always progress


def test_cap_follows_the_latency_target() -> None:
    b = PrefillBudget(target_itl_ms=20.0, minimum=64)
    assert b.tokens() is None  # nothing measured yet
    for _ in range(30):
        b.observe(decode_rows=8, prefill_tokens=0, seconds=0.010)  # decode-only steps: 10 ms
        b.observe(decode_rows=8, prefill_tokens=1000, seconds=0.030)  # + 1000 prefill tokens: 20 ms more
    assert b.tokens() == pytest.approx(500, abs=2)  # (20 - 10) ms / 0.02 ms per token
    b.observe(decode_rows=0, prefill_tokens=4000, seconds=1.0)  # a prefill-only step says nothing about decodes
    assert b.tokens() == pytest.approx(500, abs=2)
    tight = PrefillBudget(target_itl_ms=5.0, minimum=64)
    tight.observe(8, 0, 0.010)
    tight.observe(8, 100, 0.020)
    assert tight.tokens() == 64  # the target is below the decode time itself: the minimum


def test_bad_flags_are_refused() -> None:
    with pytest.raises(EngineConfigError, match="prefill-budget-with-decodes"):
        EngineConfig(prefill_budget_with_decodes=-1)
    with pytest.raises(EngineConfigError, match="target-itl-ms"):
        EngineConfig(target_itl_ms=-5)


def _steps(cap: int) -> list[tuple[int, int]]:
    """(decode rows, prefill tokens) of every step while two requests decode and a long prompt arrives."""
    eng = LLMEngine("tiny-v4-flash", EngineConfig(device="cpu", kv_cache_memory=64 << 20, max_model_len=2048,
                                                  block_size=64, max_num_batched_tokens=1024,
                                                  prefill_budget_with_decodes=cap))
    seen = []
    orig = eng.scheduler.schedule

    def schedule():
        out = orig()
        dec = sum(1 for r in out.rows if r.num_tokens == 1)
        seen.append((dec, out.num_tokens - dec))
        return out

    eng.scheduler.schedule = schedule
    g = torch.Generator().manual_seed(0)
    sp = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    for _ in range(2):
        eng.add_request(torch.randint(0, 129280, (20,), generator=g).tolist(), sp)
    for _ in range(3):
        eng.step()
    eng.add_request(torch.randint(0, 129280, (900,), generator=g).tolist(), SamplingParams(max_tokens=2))
    while eng.has_unfinished():
        eng.step()
    return seen


def test_scheduler_caps_prefill_only_beside_decodes() -> None:
    capped = _steps(128)
    assert all(p <= 128 for d, p in capped if d > 0)  # decoding requests never wait on more than the cap
    assert any(d > 0 and p > 0 for d, p in capped)  # and the prompt still progresses beside them
    free = _steps(0)
    assert max(p for d, p in free if d > 0) > 128  # without the flag the long prompt takes a big chunk
