"""The AgentX-style agentic benchmark: closed-loop session clients swept over concurrency.

Per concurrency point C:
1. C lanes (asyncio tasks) each replay sessions back to back. A lane's first session starts at a
   seeded point drawn from 25-75% of its turns, primed by a `max_tokens=1` request that
   materialises the prefix; later sessions start at turn 0 with a fresh salt.
2. Every lane sends `warmup_requests` requests, then waits at a barrier. When all lanes are there
   the measured window (`duration_s`) opens.
3. Requests that start inside the window are measured. When it ends no new request starts; those
   in flight finish (bounded by `drain_timeout_s`) and the measured wall time runs to the later
   of the window's end and the last measured completion.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from tqdm import tqdm

from v4serve.bench.client import fetch_models, first_model, make_http_client, normalize_base_url
from v4serve.bench.metrics import PointMetrics, RequestRecord, compute_point_metrics
from v4serve.bench.pacing import Pacer, PointGate, WindowClosed
from v4serve.bench.session import LaneContext, ReplayOptions, SessionRunner
from v4serve.bench.text import TokenText, default_text
from v4serve.bench.traces import SessionTrace, TraceSource, stable_seed


@dataclass
class AgenticConfig:
    base_url: str
    concurrency: list[int]
    duration_s: float
    model: str | None = None
    num_gpus: int = 1
    warmup_requests: int = 10
    seed: int = 0
    start_fraction: tuple[float, float] = (0.25, 0.75)
    think_time_scale: float = 1.0
    max_think_time_s: float = 300.0
    global_idle_cap_s: float | None = 10.0
    replies: str = "auto"
    send_cache_salt: bool = False
    extra_body: dict[str, Any] | None = None
    request_timeout_s: float = 3600.0
    drain_timeout_s: float | None = None  # default: request_timeout_s
    warmup_timeout_s: float | None = None  # default: request_timeout_s; then the window opens anyway
    progress: bool = True
    api_key: str | None = field(default=None, repr=False)  # sent as a Bearer token; never written to reports


@dataclass
class PointRun:
    metrics: PointMetrics
    records: list[RequestRecord]
    window_start_s: float = 0.0  # when the measured window opened, on the records' clock
    lane_errors: list[str] = field(default_factory=list)


@dataclass
class AgenticRun:
    model: str
    server_models: dict[str, Any]
    points: list[PointRun]
    started_at: float  # unix time
    wall_s: float


def start_turn(session: SessionTrace, seed: int, index: int, fraction: tuple[float, float]) -> int:
    """Seeded start point in [lo, hi) of the root conversation's turns."""
    n = len(session.root.turns)
    u = random.Random(stable_seed("start", seed, index)).uniform(*fraction)
    return min(n - 1, int(u * n))


def session_salt(nonce: str, concurrency: int, lane: int, k: int) -> str:
    return f"{stable_seed('salt', nonce, concurrency, lane, k):016x}"[:12]


async def run_agentic(cfg: AgenticConfig, source: TraceSource, text: TokenText | None = None) -> AgenticRun:
    text = text or default_text()
    started = time.time()
    t0 = time.perf_counter()
    nonce = f"{started:.6f}"  # different salts on every run: nothing is cached from a previous run
    async with make_http_client(cfg.request_timeout_s, cfg.api_key) as http:
        models = await fetch_models(http, cfg.base_url)
        model = cfg.model or first_model(models)
        options = ReplayOptions(
            model=model,
            chat_url=f"{normalize_base_url(cfg.base_url)}/v1/chat/completions",
            think_time_scale=cfg.think_time_scale,
            max_think_time_s=cfg.max_think_time_s,
            replies=cfg.replies,
            send_cache_salt=cfg.send_cache_salt,
            extra_body=cfg.extra_body,
        )
        points = []
        for concurrency in cfg.concurrency:
            points.append(await run_point(cfg, source, concurrency, http, options, text, nonce))
    return AgenticRun(model, models, points, started, time.perf_counter() - t0)


async def run_point(
    cfg: AgenticConfig,
    source: TraceSource,
    concurrency: int,
    http: Any,
    options: ReplayOptions,
    text: TokenText,
    nonce: str,
) -> PointRun:
    gate = PointGate(concurrency, cfg.warmup_requests)
    pacer = Pacer(cfg.global_idle_cap_s)
    ctx = LaneContext(http, options, gate, pacer, text, t0=time.perf_counter())
    lane_errors: list[str] = []

    async def lane(i: int) -> None:
        runner = SessionRunner(i, ctx)
        k = 0
        try:
            while not gate.closed:
                index = i + k * concurrency
                session = source.session(index)
                start = start_turn(session, cfg.seed, index, cfg.start_fraction) if k == 0 else 0
                await runner.run(session, session_salt(nonce, concurrency, i, k), start)
                k += 1
                await asyncio.sleep(0)
        except WindowClosed:
            pass
        except Exception as exc:  # noqa: BLE001 - keep the other lanes going; reported with the point
            lane_errors.append(f"lane {i}: {type(exc).__name__}: {exc}")
        finally:
            gate.lane_ready(i)  # a lane that is gone must not hold the barrier

    lanes = [asyncio.create_task(lane(i)) for i in range(concurrency)]
    watcher = asyncio.create_task(pacer.watch_idle())
    progress = asyncio.create_task(_progress(cfg, gate, ctx, concurrency))
    try:
        try:
            await asyncio.wait_for(gate.wait_released(), cfg.warmup_timeout_s or cfg.request_timeout_s)
        except TimeoutError:
            gate.release()
        assert gate.window_start is not None
        await asyncio.sleep(max(0.0, gate.window_start + cfg.duration_s - time.perf_counter()))
        gate.close()
        pacer.close()
        await asyncio.wait(lanes, timeout=cfg.drain_timeout_s or cfg.request_timeout_s)
    finally:  # stragglers past the drain timeout (or an interrupted run) are cancelled, unrecorded
        tasks = [*lanes, watcher, progress]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    window_start = (gate.window_start or ctx.t0) - ctx.t0
    measured_end = max((r.end_s for r in ctx.records if r.phase == "measured"), default=0.0)
    duration = max(cfg.duration_s, measured_end - window_start)
    metrics = compute_point_metrics(ctx.records, concurrency, cfg.num_gpus, duration, pacer.max_inflight)
    metrics.errors.extend(lane_errors[:5])
    return PointRun(metrics, ctx.records, window_start, lane_errors)


async def _progress(cfg: AgenticConfig, gate: PointGate, ctx: LaneContext, concurrency: int) -> None:
    """Progress bars: warm-up requests, then seconds of the measured window with live counts."""
    disable = not cfg.progress
    bar = tqdm(
        total=concurrency * cfg.warmup_requests,
        desc=f"c={concurrency} warm-up",
        unit="req",
        disable=disable,
        file=sys.stderr,
        leave=False,
    )
    try:
        while not gate.released:
            bar.n = gate.warmup_done
            bar.refresh()
            await asyncio.sleep(0.5)
    finally:
        bar.close()
    total = max(1, round(cfg.duration_s))
    layout = "{desc}: {percentage:3.0f}%|{bar}| {n}/{total} s [{elapsed}<{remaining}{postfix}]"
    bar = tqdm(
        total=total, desc=f"c={concurrency} measure", bar_format=layout, disable=disable, file=sys.stderr
    )
    try:
        while True:
            assert gate.window_start is not None
            bar.n = min(total, int(time.perf_counter() - gate.window_start))
            measured = [r for r in ctx.records if r.phase == "measured"]
            bar.set_postfix(
                done=sum(r.ok for r in measured),
                err=sum(not r.ok for r in measured),
                inflight=ctx.pacer.inflight,
                refresh=False,
            )
            bar.refresh()
            await asyncio.sleep(0.5)
    finally:
        bar.close()
