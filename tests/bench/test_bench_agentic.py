"""The closed-loop session runner against the local stand-in server: phases, barrier, prefix
extension, salts, forced lengths, subagent fan-out, error accounting; and the pacing primitives."""

import asyncio
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the stand-in server next to this file
from fake_openai_server import FakeOpenAIServer, FakeServerConfig

from v4serve.bench.agentic import AgenticConfig, run_agentic, start_turn
from v4serve.bench.pacing import Pacer, PointGate, WindowClosed
from v4serve.bench.synthetic import SyntheticTraceConfig, SyntheticTraceSource

TINY = SyntheticTraceConfig(scale=0.002, output_scale=0.01, seed=5)


def _config(url, **kw):
    base = {
        "base_url": url,
        "concurrency": [3],
        "duration_s": 0.8,
        "warmup_requests": 2,
        "think_time_scale": 0.0,
        "progress": False,
    }
    return AgenticConfig(**(base | kw))


@pytest.fixture(scope="module")
def server():
    with FakeOpenAIServer(FakeServerConfig(ttft_s=0.002, itl_s=0.001)) as s:
        yield s


@pytest.fixture(scope="module")
def run_and_requests(server):
    start = len(server.requests)
    run = asyncio.run(run_agentic(_config(server.base_url), SyntheticTraceSource(TINY)))
    return run, server.requests[start:]


def test_phases_barrier_and_forced_lengths(run_and_requests):
    run, _ = run_and_requests
    (point,) = run.points
    recs = point.records
    assert run.model == "fake-v4"
    primes = [r for r in recs if r.phase == "prime"]
    warmups = [r for r in recs if r.phase == "warmup"]
    measured = [r for r in recs if r.phase == "measured"]
    assert len(primes) == 3  # every lane starts mid-session (25-75%), primed first
    assert len(warmups) == 3 * 2  # exactly the warm-up budget per lane
    assert max(r.start_s for r in warmups) <= point.window_start_s <= min(r.start_s for r in measured)
    assert (
        min(r.start_s for r in measured) < point.window_start_s + 0.8
    )  # only requests started in the window
    m = point.metrics
    assert m.requests_completed == len(measured) > 3 and m.error_rate == 0
    assert m.output_length_mismatches == 0  # ignore_eos/min_tokens honoured (natural length is 3)
    assert all(r.completion_tokens == 1 for r in primes)
    assert m.tpgs > 0 and m.interactivity_p90 is not None and m.duration_s >= 0.8
    assert m.cached_tokens_reported and m.hit_rate > 0.6
    assert m.hit_rate == pytest.approx(m.theoretical_hit_rate, abs=0.05)


def test_every_request_extends_an_earlier_one_textually(run_and_requests):
    _, requests = run_and_requests
    seen: list[tuple] = []
    primed: set[tuple] = set()
    for body in requests:
        msgs = body["messages"]
        key = tuple((m["role"], m["content"]) for m in msgs)
        if body["max_tokens"] == 1 and not body.get("ignore_eos"):  # prime: rebuilt history
            assert msgs[0]["content"].startswith("[session ")
            primed.add(key)
        elif len(msgs) <= 2 and msgs[0]["content"].startswith("[session "):
            pass  # the opening of a session or of a fresh subagent
        elif key in primed:
            pass  # the first real turn after its prime sends the primed messages unchanged
        else:
            prev, (asst, user) = key[:-2], key[-2:]
            assert prev in {k for k, _ in seen}, "not an extension of an earlier request"
            n = dict(seen)[prev]
            assert asst == ("assistant", "".join(f" w{i}" for i in range(n)))  # the live reply text
            assert user[0] == "user"
        seen.append((key, body["max_tokens"]))


def test_sessions_are_salted_apart(run_and_requests):
    run, requests = run_and_requests
    primes = [
        b["messages"][0]["content"] for b in requests if b["max_tokens"] == 1 and not b.get("ignore_eos")
    ]
    assert len(set(primes)) == len(primes) == 3
    assert all(r.cached_tokens == 0 for r in run.points[0].records if r.phase == "prime")


def test_start_turn_is_seeded_within_25_to_75_percent():
    src = SyntheticTraceSource(TINY)
    for i in range(50):
        n = len(src.session(i).root.turns)
        s = start_turn(src.session(i), 0, i, (0.25, 0.75))
        assert int(0.25 * n) <= s <= int(0.75 * n) and s == start_turn(src.session(i), 0, i, (0.25, 0.75))


def test_subagents_fan_out_and_join(server):
    cfg = SyntheticTraceConfig(
        scale=0.002,
        output_scale=0.01,
        seed=2,
        subagent_session_share=1.0,
        subagent_groups_median=12,
        children_per_group_mean=3,
    )
    run = asyncio.run(
        run_agentic(_config(server.base_url, concurrency=[1], warmup_requests=0), SyntheticTraceSource(cfg))
    )
    point = run.points[0]
    assert any("/g" in r.conv_id for r in point.records)
    assert point.metrics.max_inflight >= 2  # parallel children at concurrency 1


def test_errors_are_counted_and_sessions_continue():
    with FakeOpenAIServer(FakeServerConfig(ttft_s=0.001, itl_s=0.0005, fail_every=5)) as s:
        run = asyncio.run(
            run_agentic(_config(s.base_url, concurrency=[2], warmup_requests=1), SyntheticTraceSource(TINY))
        )
    m = run.points[0].metrics
    assert m.requests_failed > 0 and m.requests_completed > 0
    assert 0.05 < m.error_rate < 0.5
    assert m.errors and m.errors[0].startswith("HTTP 500")


async def test_gate_warmup_budget_barrier_and_close():
    gate = PointGate(num_lanes=2, warmup_requests=1)
    assert await gate.admit(0, prime=True) == "prime"
    assert await gate.admit(0) == "warmup"
    waiting = asyncio.create_task(gate.admit(0))  # lane 0 waits at the barrier
    await asyncio.sleep(0.01)
    assert not waiting.done()
    assert await gate.admit(1) == "warmup"
    last = asyncio.create_task(gate.admit(1))  # the last lane arrives: the window opens
    assert await waiting == "measured" and await last == "measured"
    gate.close()
    with pytest.raises(WindowClosed):
        await gate.admit(0)


async def test_pacer_caps_global_idle_time():
    pacer = Pacer(global_idle_cap_s=0.2)
    watcher = asyncio.create_task(pacer.watch_idle())
    t = time.perf_counter()
    await pacer.sleep(30)  # nothing in flight anywhere: woken after ~0.2 s
    assert time.perf_counter() - t < 2
    pacer.started()
    t = time.perf_counter()
    await pacer.sleep(0.3)  # something in flight: the think time is kept
    assert time.perf_counter() - t >= 0.29
    watcher.cancel()


async def test_pacer_close_ends_and_skips_think_times():
    pacer = Pacer(global_idle_cap_s=None)
    sleeper = asyncio.create_task(pacer.sleep(30))
    await asyncio.sleep(0.01)
    pacer.close()
    await asyncio.wait_for(sleeper, 1)
    t = time.perf_counter()
    await pacer.sleep(30)
    assert time.perf_counter() - t < 0.1
