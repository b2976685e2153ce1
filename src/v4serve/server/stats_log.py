"""The periodic stats line (vLLM prints one too): throughput, running / waiting requests, KV use, prefix-cache hit
rate and the interval's step times by kind (decode-only, mixed, prefill-only: what inter-token latency is made of),
every `--log-stats-interval` seconds while the server runs (off with `--disable-log-stats`)."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from ..engine import step_stats

log = logging.getLogger("v4serve.server")


@dataclass
class Totals:
    """Cumulative counters at one moment: prompt tokens admitted by the engine and their cached part (engine
    stats), tokens generated for finished requests (server metrics)."""

    at: float
    prompt: float
    cached: float
    generated: float
    steps: dict[str, Any] | None = None  # the engine's step times by kind (engine/step_stats.py), cumulative


def totals(stats: dict[str, Any], generated: float, at: float) -> Totals:
    return Totals(at, float(stats.get("prompt_tokens", 0)), float(stats.get("cached_tokens", 0)), generated,
                  stats.get("step_stats"))


def stats_line(stats: dict[str, Any], prev: Totals, now: Totals) -> str:
    dt = max(now.at - prev.at, 1e-9)
    prompt, cached = now.prompt - prev.prompt, now.cached - prev.cached
    hit = f"{100 * cached / prompt:.1f}%" if prompt > 0 else "-"
    steps = step_stats.interval_line(prev.steps, now.steps) if now.steps else ""
    return (f"prompt throughput {(prompt - cached) / dt:.1f} tok/s (computed), generation throughput "
            f"{(now.generated - prev.generated) / dt:.1f} tok/s; running {stats.get('running', 0)}, waiting "
            f"{stats.get('waiting', 0)}; KV cache usage {100 * float(stats.get('kv_usage', 0.0)):.1f}%; prefix "
            f"cache hit rate {hit} (this interval), "
            f"{100 * now.cached / now.prompt if now.prompt else 0.0:.1f}% (since start)"
            + (f"; {steps}" if steps else ""))


async def log_stats(client, generated_tokens, interval: float) -> None:
    """Every `interval` s: one stats line (skipped while the engine is idle and nothing moved)."""
    prev: Totals | None = None
    while True:
        await asyncio.sleep(interval)
        try:
            stats = await client.stats()
        except Exception as err:  # noqa: BLE001 - the line is informative only; the watchdog handles a dead engine
            log.debug("stats unavailable: %s", err)
            continue
        now = totals(stats, generated_tokens(), time.monotonic())
        busy = stats.get("running", 0) or stats.get("waiting", 0)
        if prev is not None and (busy or now.prompt != prev.prompt or now.generated != prev.generated):
            log.info("%s", stats_line(stats, prev, now))
        prev = now
