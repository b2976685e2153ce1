"""Step times by kind (engine/step_stats.py): the counters, their bucket quantiles, the stats line's interval text,
and the engine's own accounting of the steps it ran."""

from __future__ import annotations

import math

import torch

from v4serve.engine.config import EngineConfig
from v4serve.engine.llm_engine import LLMEngine
from v4serve.engine.sampling_params import SamplingParams
from v4serve.engine.step_stats import EDGES, StepStats, bucket_quantile, interval_line, kind


def test_kinds() -> None:
    assert kind(4, 0) == "decode" and kind(4, 300) == "mixed" and kind(0, 300) == "prefill"


def test_buckets_and_quantiles() -> None:
    s = StepStats()
    for _ in range(9):
        s.observe(8, 0, 0.0025)  # graphed decode steps: the (2, 3] ms bucket
    s.observe(8, 480, 0.040)  # one mixed step: (30, 50] ms
    s.observe(0, 4000, 12.0)  # a prefill past the last edge
    d = s.as_dict()
    assert d["decode"]["count"] == 9 and math.isclose(d["decode"]["seconds"], 9 * 0.0025)
    assert d["decode"]["buckets"][EDGES.index(0.003)] == 9
    assert d["mixed"]["prefill_tokens"] == 480 and d["mixed"]["buckets"][EDGES.index(0.05)] == 1
    assert d["prefill"]["buckets"][-1] == 1
    assert bucket_quantile(d["decode"]["buckets"], 0.9) == 0.003
    assert bucket_quantile(d["prefill"]["buckets"], 0.5) == math.inf
    assert bucket_quantile([0] * (len(EDGES) + 1), 0.5) is None
    both = [a + b for a, b in zip(d["decode"]["buckets"], d["mixed"]["buckets"])]
    assert bucket_quantile(both, 0.9) == 0.003 and bucket_quantile(both, 0.95) == 0.05  # 1 slow step in 10


def test_interval_line_takes_differences() -> None:
    s = StepStats()
    s.observe(8, 0, 0.0025)
    first = s.as_dict()
    for _ in range(3):
        s.observe(8, 200, 0.018)
    s.observe(8, 0, 0.0045)
    line = interval_line(first, s.as_dict())
    assert line == "steps: decode 1 (p50 <= 5 / p90 <= 5 ms), mixed 3 (p50 <= 20 / p90 <= 20 ms; 200 prefill " \
                   "tokens each)"
    assert interval_line(s.as_dict(), s.as_dict()) == ""  # nothing ran
    assert interval_line(None, first).startswith("steps: decode 1 (p50 <= 3")


def test_engine_counts_its_steps_by_kind() -> None:
    """Two requests decode while a prompt arrives: the engine's counters agree with the scheduler's steps."""
    eng = LLMEngine("tiny-v4-flash", EngineConfig(device="cpu", kv_cache_memory=64 << 20, max_model_len=2048,
                                                  block_size=64, max_num_batched_tokens=1024))
    seen: list[str] = []
    orig = eng.scheduler.schedule

    def schedule():
        out = orig()
        if not out.empty:
            dec = sum(1 for r in out.rows if r.num_tokens == 1)
            seen.append(kind(dec, out.num_tokens - dec))
        return out

    eng.scheduler.schedule = schedule
    g = torch.Generator().manual_seed(0)
    sp = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    for _ in range(2):
        eng.add_request(torch.randint(0, 129280, (20,), generator=g).tolist(), sp)
    eng.step()
    eng.step()
    eng.add_request(torch.randint(0, 129280, (100,), generator=g).tolist(), sp)
    while eng.has_unfinished():
        eng.step()
    stats = eng.stats()["step_stats"]
    assert {k: seen.count(k) for k in ("decode", "mixed", "prefill")} == {k: v["count"] for k, v in stats.items()}
    assert stats["mixed"]["count"] >= 1 and stats["decode"]["count"] >= 1 and stats["prefill"]["count"] >= 1
    assert stats["mixed"]["prefill_tokens"] == 100 and all(v["seconds"] > 0 for v in stats.values())
