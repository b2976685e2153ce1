"""Prometheus metrics of the API server (`GET /metrics`).

Two sources. The server itself observes every request: counts by route and outcome, time to first token,
inter-token latency, end-to-end latency, prompt / generated / cached tokens. The engine's own counters
(running and waiting requests, preemptions, KV blocks and bytes by cache kind, prefix-cache hits, misses
and why) are read with `client.stats()` when /metrics is scraped and exported as they are, so they stay
exact however the engine's state moved between scrapes.
"""

from __future__ import annotations

import re
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from ..engine.step_stats import EDGES
from .vllm_metrics import VllmMetrics

PREFIX = "v4serve"
_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                    7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
                0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 80.0)


class EngineStatsCollector(Collector):
    """Exports the last engine stats snapshot (set by `ServerMetrics.render` just before collection)."""

    def __init__(self) -> None:
        self.stats: dict[str, Any] | None = None

    def collect(self):
        s = self.stats
        if not s:
            return
        yield GaugeMetricFamily(f"{PREFIX}_num_requests_running", "requests the engine is stepping",
                                value=s.get("running", 0))
        yield GaugeMetricFamily(f"{PREFIX}_num_requests_waiting", "requests queued in the engine",
                                value=s.get("waiting", 0))
        yield CounterMetricFamily(f"{PREFIX}_num_preemptions", "requests preempted to free KV blocks",
                                  value=s.get("preemptions", 0))
        yield GaugeMetricFamily(f"{PREFIX}_kv_cache_usage_ratio", "fraction of KV blocks in use (0-1)",
                                value=s.get("kv_usage", 0.0))
        blocks = GaugeMetricFamily(f"{PREFIX}_kv_cache_blocks", "KV blocks: total, used by requests, "
                                   "cached for prefix reuse (free but reusable)", labels=["state"])
        for state in ("total", "used", "cached"):
            blocks.add_metric([state], s.get(f"blocks_{state}", 0))
        yield blocks
        by_kind = GaugeMetricFamily(f"{PREFIX}_kv_cache_bytes", "KV bytes held by running requests, by cache "
                                    "kind (compressed entries, index keys, window, compressor state)",
                                    labels=["kind"])
        for kind, value in sorted((s.get("kv_bytes_by_kind") or {}).items()):
            by_kind.add_metric([kind], value)
        yield by_kind
        yield CounterMetricFamily(f"{PREFIX}_prefix_cache_hits", "requests whose prompt hit the prefix cache",
                                  value=s.get("prefix_hits", 0))
        misses = CounterMetricFamily(f"{PREFIX}_prefix_cache_misses", "requests that found no reusable prefix, "
                                     "by reason", labels=["reason"])
        for reason, value in sorted((s.get("prefix_miss_reasons") or {}).items()):
            misses.add_metric([reason], value)
        yield misses
        kinds = CounterMetricFamily(f"{PREFIX}_prefix_cache_hits_by_kind", "prefix hits by how the window was "
                                    "rebuilt (checkpoint, exact replay, bounded replay)", labels=["kind"])
        for kind, value in sorted((s.get("prefix_hit_kinds") or {}).items()):
            kinds.add_metric([kind], value)
        yield kinds
        prompt, cached = s.get("prompt_tokens", 0), s.get("cached_tokens", 0)
        yield CounterMetricFamily(f"{PREFIX}_engine_prompt_tokens", "prompt tokens admitted by the engine "
                                  "(preempted requests count again)", value=prompt)
        yield CounterMetricFamily(f"{PREFIX}_engine_cached_tokens", "prompt tokens served from the prefix "
                                  "cache", value=cached)
        yield CounterMetricFamily(f"{PREFIX}_engine_replayed_tokens", "tokens recomputed to rebuild the "
                                  "sliding window on prefix hits", value=s.get("replayed_tokens", 0))
        yield GaugeMetricFamily(f"{PREFIX}_prefix_cache_hit_rate", "cached / prompt tokens since start (0-1)",
                                value=cached / prompt if prompt else 0.0)
        yield GaugeMetricFamily(f"{PREFIX}_max_model_len", "context length", value=s.get("max_model_len", 0))
        steps = s.get("step_stats")
        if steps:
            yield _step_histogram(steps)


def _step_histogram(steps: dict[str, dict]) -> HistogramMetricFamily:
    """The engine's step times by kind (engine/step_stats.py: cumulative bucket counts) as one histogram."""
    h = HistogramMetricFamily(f"{PREFIX}_engine_step_seconds", "engine step wall time by kind: decode (decode rows "
                              "only), mixed (decode rows and prefill tokens), prefill (prefill only)",
                              labels=["kind"])
    for kind, d in steps.items():
        cumulative, buckets = 0, []
        for edge, n in zip(list(EDGES) + [float("inf")], d["buckets"]):
            cumulative += n
            buckets.append(("+Inf" if edge == float("inf") else repr(edge), cumulative))
        h.add_metric([kind], buckets, sum_value=d["seconds"])
    return h


class ServerMetrics:
    """All metrics of one server, in their own registry (several apps can live in one test process)."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r, p = self.registry, PREFIX
        self.requests = Counter(f"{p}_requests", "finished requests by route and finish reason "
                                "(stop, length, tool_calls, abort = client went away, error)",
                                ["route", "finish_reason"], registry=r)
        self.errors = Counter(f"{p}_request_errors", "requests answered with an HTTP error, by route and "
                              "status", ["route", "status"], registry=r)
        self.ttft = Histogram(f"{p}_time_to_first_token_seconds", "arrival to first generated token",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram(f"{p}_inter_token_latency_seconds", "time between generated tokens of a request",
                             buckets=_ITL_BUCKETS, registry=r)
        self.e2e = Histogram(f"{p}_e2e_request_latency_seconds", "arrival to last token",
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter(f"{p}_prompt_tokens", "prompt tokens of finished requests", registry=r)
        self.generation_tokens = Counter(f"{p}_generation_tokens", "generated tokens", registry=r)
        self.cached_tokens = Counter(f"{p}_cached_prompt_tokens", "prompt tokens served from the prefix cache "
                                     "(usage.prompt_tokens_details.cached_tokens)", registry=r)
        self.in_flight = Gauge(f"{p}_requests_in_flight", "engine requests admitted by the server and not "
                               "finished (n > 1 counts n)", registry=r)
        self.engine_alive = Gauge(f"{p}_engine_alive", "1 while the engine process is running", registry=r)
        Gauge(f"{p}_model_info", "the served model", ["model"], registry=r).labels(model_name).set(1)
        self.engine = EngineStatsCollector()
        r.register(self.engine)
        self.vllm = VllmMetrics(r, model_name)  # the same observations under vLLM's names (vllm_metrics.py)
        self._routes: list[tuple[re.Pattern[str], str]] = []
        self.generated_total = 0  # tokens of finished requests, for the periodic stats line

    def set_routes(self, routes: list[tuple[re.Pattern[str], str]]) -> None:
        """The app's route patterns and their templates: the only `route` label values besides "other"."""
        self._routes = routes

    def route_label(self, path: str) -> str:
        """A bounded label for a request path: its route template, or "other" (unknown paths and probes must not
        add a series each)."""
        for pattern, template in self._routes:
            if pattern.match(path):
                return template
        return "other"

    def count_error(self, path: str, status: int) -> None:
        self.errors.labels(self.route_label(path), str(status)).inc()

    def observe_finished(self, route: str, finish_reason: str, prompt_tokens: int, output_tokens: int,
                         cached_tokens: int) -> None:
        self.requests.labels(route, finish_reason).inc()
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(output_tokens)
        self.generated_total += output_tokens
        self.cached_tokens.inc(cached_tokens)

    def render(self, engine_stats: dict[str, Any] | None, alive: bool) -> bytes:
        self.engine.stats = self.vllm.engine.stats = engine_stats
        self.engine_alive.set(1 if alive else 0)
        return generate_latest(self.registry)
