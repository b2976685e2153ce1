"""vLLM's metric names, so a dashboard built for vLLM reads v4serve by changing the `vllm:` prefix to `v4serve:`.

Same names, types and label sets as vLLM's V1 metrics (a `model_name` label on every series; prefix-cache queries
and hits counted in tokens). Server-side observations: TTFT, inter-token latency, end-to-end latency, decode time
(first to last token), prompt / generation tokens per request, finished requests by reason. From the engine's
stats at scrape time: running / waiting requests, KV-cache usage, preemptions, prefix-cache queries and hits.
Engine-timed (reported on each request's last delta, and per step): request queue / prefill / inference time and
the tokens of each engine step (iteration_tokens_total).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

P = "v4serve:"
_LATENCY = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
            80.0, 160.0, 640.0, 2560.0)
_ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_TOKENS = tuple(float(m * 10**e) for e in range(0, 7) for m in (1, 2, 5))  # 1, 2, 5, 10, ... 5M


class VllmEngineCollector(Collector):
    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.stats: dict[str, Any] | None = None

    def collect(self):
        s, name = self.stats, [self.model_name]
        if not s:
            return
        for metric, help_text, value in (
                ("num_requests_running", "Number of requests in model execution batches.", s.get("running", 0)),
                ("num_requests_waiting", "Number of requests waiting to be processed.", s.get("waiting", 0)),
                ("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", s.get("kv_usage", 0.0))):
            g = GaugeMetricFamily(P + metric, help_text, labels=["model_name"])
            g.add_metric(name, value)
            yield g
        for metric, help_text, value in (
                ("num_preemptions", "Cumulative number of preemptions from the engine.", s.get("preemptions", 0)),
                ("prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
                 s.get("prompt_tokens", 0)),
                ("prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
                 s.get("cached_tokens", 0))):
            c = CounterMetricFamily(P + metric, help_text, labels=["model_name"])
            c.add_metric(name, value)
            yield c


class VllmMetrics:
    """The server-observed series under vLLM's names, in the server's registry."""

    def __init__(self, registry: CollectorRegistry, model_name: str) -> None:
        self.model_name = model_name
        lab, r = ["model_name"], registry
        self.ttft = Histogram(P + "time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              lab, buckets=_LATENCY, registry=r).labels(model_name)
        self.itl = Histogram(P + "inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             lab, buckets=_ITL, registry=r).labels(model_name)
        self.e2e = Histogram(P + "e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                             lab, buckets=_LATENCY, registry=r).labels(model_name)
        self.decode = Histogram(P + "request_decode_time_seconds", "Histogram of time spent in DECODE phase for "
                                "request (first to last token, as the server sees it).", lab, buckets=_LATENCY,
                                registry=r).labels(model_name)
        self.prompt_hist = Histogram(P + "request_prompt_tokens", "Number of prefill tokens processed.", lab,
                                     buckets=_TOKENS, registry=r).labels(model_name)
        self.gen_hist = Histogram(P + "request_generation_tokens", "Number of generation tokens processed.", lab,
                                  buckets=_TOKENS, registry=r).labels(model_name)
        self.prompt_tokens = Counter(P + "prompt_tokens", "Number of prefill tokens processed.", lab,
                                     registry=r).labels(model_name)
        self.generation_tokens = Counter(P + "generation_tokens", "Number of generation tokens processed.", lab,
                                         registry=r).labels(model_name)
        self.queue = Histogram(P + "request_queue_time_seconds", "Histogram of time spent in WAITING phase for "
                               "request.", lab, buckets=_LATENCY, registry=r).labels(model_name)
        self.prefill = Histogram(P + "request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for "
                                 "request.", lab, buckets=_LATENCY, registry=r).labels(model_name)
        self.inference = Histogram(P + "request_inference_time_seconds", "Histogram of time spent in RUNNING phase "
                                   "for request.", lab, buckets=_LATENCY, registry=r).labels(model_name)
        self.iteration_tokens = Histogram(P + "iteration_tokens_total", "Histogram of number of tokens per engine_step.",
                                          lab, buckets=_TOKENS, registry=r).labels(model_name)
        self.success = Counter(P + "request_success", "Count of successfully processed requests.",
                               ["model_name", "finished_reason"], registry=r)
        self.engine = VllmEngineCollector(model_name)
        r.register(self.engine)

    def phases(self, queue_s: float | None, prefill_s: float | None, inference_s: float | None) -> None:
        """The engine's timing of one finished request."""
        for hist, value in ((self.queue, queue_s), (self.prefill, prefill_s), (self.inference, inference_s)):
            if value is not None:
                hist.observe(max(value, 0.0))

    def finished(self, finish_reason: str, prompt_tokens: int, output_tokens: int, first: float | None,
                 last: float | None) -> None:
        if finish_reason in ("stop", "length", "abort", "tool_calls"):
            self.success.labels(self.model_name, "stop" if finish_reason == "tool_calls" else finish_reason).inc()
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(output_tokens)
        self.prompt_hist.observe(prompt_tokens)
        self.gen_hist.observe(output_tokens)
        if first is not None and last is not None:
            self.decode.observe(last - first)
