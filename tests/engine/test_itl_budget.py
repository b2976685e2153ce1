"""The prefill budget beside decodes (engine/itl_budget.py): a fixed cap or one derived from an inter-token-latency
target, applied by the scheduler only to steps that also decode."""

from __future__ import annotations

import pytest
import torch

from v4serve.engine.config import EngineConfig, EngineConfigError
from v4serve.engine.itl_budget import AUTO_GATE_STEPS, PrefillBudget, PrefillGate, gate_steps
from v4serve.engine.llm_engine import LLMEngine
from v4serve.engine.sampling_params import SamplingParams

from .common import DEVICE


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


def test_prefill_gate() -> None:
    assert PrefillGate().open(0.0, 0.0) and not PrefillGate().active
    g = PrefillGate(every=3, max_delay_ms=100.0)
    assert g.open(5.0, None)  # nothing pending
    assert not g.open(5.0, 4.95)  # pending 50 ms, no decode-only step yet
    for _ in range(2):
        g.note(decode_rows=4, prefill_tokens=0)
    assert not g.open(5.0, 4.95)
    assert g.open(5.0, 4.85)  # pending 150 ms: over the bound
    g.note(4, 0)
    assert g.open(5.0, 4.99)  # three decode-only steps
    g.note(4, 200)  # a step with prefill closes it again
    assert not g.open(5.0, 4.99)
    g.note(0, 0)  # an empty step is not a decode step
    assert g.decode_only_steps == 0
    assert not PrefillGate(every=3, max_delay_ms=0.0).open(1e9, 0.0)  # no bound: only the step count opens it


def _steps(cap: int, gate: int = 0, delay_ms: float = 0.0,
           outputs: list[list[int]] | None = None) -> list[tuple[int, int]]:
    """(decode rows, prefill tokens) of every step while two requests decode and prompts arrive (a long one, then
    three short ones a step apart); each request's greedy tokens into `outputs`."""
    eng = LLMEngine("tiny-v4-flash", EngineConfig(device="cpu", kv_cache_memory=64 << 20, max_model_len=2048,
                                                  block_size=64, max_num_batched_tokens=1024,
                                                  prefill_budget_with_decodes=cap,
                                                  decode_steps_between_prefills=gate, max_prefill_delay_ms=delay_ms))
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
    tokens: dict[str, list[int]] = {}
    ids = []

    def step() -> None:
        for d in eng.step():
            tokens.setdefault(d.request_id, []).extend(d.new_token_ids)

    for _ in range(2):
        ids += eng.add_request(torch.randint(0, 129280, (20,), generator=g).tolist(), sp)
    for _ in range(3):
        step()
    ids += eng.add_request(torch.randint(0, 129280, (900,), generator=g).tolist(),
                           SamplingParams(max_tokens=2, temperature=0))
    for _ in range(3):
        step()
        ids += eng.add_request(torch.randint(0, 129280, (40,), generator=g).tolist(),
                               SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    while eng.has_unfinished():
        step()
    if outputs is not None:
        outputs += [tokens.get(i, []) for i in ids]
    return seen


def test_scheduler_caps_prefill_only_beside_decodes() -> None:
    capped = _steps(128)
    assert all(p <= 128 for d, p in capped if d > 0)  # decoding requests never wait on more than the cap
    assert any(d > 0 and p > 0 for d, p in capped)  # and the prompt still progresses beside them
    free = _steps(0)
    assert max(p for d, p in free if d > 0) > 128  # without the flag the long prompt takes a big chunk


def test_gate_groups_prefills_beside_decodes() -> None:
    """--decode-steps-between-prefills 4: prefill joins decode rows only after 4 decode-only steps (the short prompts
    arriving meanwhile then share a step), never delays a step without decode rows, and changes no token."""
    free_out: list[list[int]] = []
    gated_out: list[list[int]] = []
    free = _steps(0, outputs=free_out)
    gated = _steps(0, gate=4, outputs=gated_out)
    assert gated_out == free_out and all(free_out)

    def gaps(steps: list[tuple[int, int]]) -> list[int]:
        """Decode-only steps before each step that has decode rows and prefill."""
        out, run = [], 0
        for d, p in steps:
            if d and p:
                out.append(run)
                run = 0
            elif d:
                run += 1
        return out

    assert min(gaps(gated)) >= 4
    assert min(gaps(free)) < 4  # without the gate prefill joins the next step
    # the first step that lets prefill in takes the long prompt's first chunk and the short prompts that came
    # meanwhile (256 + 2 x 40), where without the gate they trickle in one by one
    first = next(p for d, p in gated if d and p)
    assert first > next(p for d, p in free if d and p) and first > 256


def test_gate_delay_bound() -> None:
    """A prompt pending longer than --max-prefill-delay-ms joins the next step whatever the step count."""
    bounded = _steps(0, gate=10_000, delay_ms=1e-3)  # every pending prompt is over the bound at once
    assert any(d and p for d, p in bounded)
    with pytest.raises(EngineConfigError, match="decode-steps-between-prefills"):
        EngineConfig(decode_steps_between_prefills=-1)
    with pytest.raises(EngineConfigError, match="max-prefill-delay-ms"):
        EngineConfig(max_prefill_delay_ms=-1)


def test_gate_default_follows_the_decode_graphs() -> None:
    """Unset, the gate is AUTO_GATE_STEPS where decode steps run as CUDA graphs (a mixed step is eager, several graphed
    steps long) and off elsewhere; an explicit value (0 included) wins."""

    assert gate_steps(None, graphed=True) == AUTO_GATE_STEPS and gate_steps(None, graphed=False) == 0
    assert gate_steps(0, graphed=True) == 0 and gate_steps(5, graphed=False) == 5
    cfg = dict(device=DEVICE, kv_cache_memory=64 << 20, max_model_len=1024, block_size=64)
    eng = LLMEngine("tiny-v4-flash", EngineConfig(**cfg))
    assert eng.scheduler.prefill_gate.every == (AUTO_GATE_STEPS if DEVICE == "cuda" else 0)
    assert eng.scheduler.prefill_gate.max_delay == pytest.approx(0.150)
    assert LLMEngine("tiny-v4-flash", EngineConfig(**cfg, enforce_eager=True)).scheduler.prefill_gate.every == 0
    assert LLMEngine("tiny-v4-flash", EngineConfig(**cfg, decode_steps_between_prefills=3)
                     ).scheduler.prefill_gate.every == 3
