"""The classic serving benchmark: random-length prompts at a request rate, `vllm bench serve` metrics.

Metric names and definitions follow `vllm bench serve` so that e.g. 8K-in/1K-out runs can be set
next to published figures: TTFT, TPOT = (E2EL - TTFT) / (output tokens - 1), ITL (gaps between
token-bearing chunks), E2EL, each as mean/median/std/pXX in ms; request, output and total token
throughput; goodput = requests per second that meet every `--goodput` SLO. Token totals are the
server's `usage` counts. Per-GPU throughputs are added for tables that report tok/s/GPU.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tqdm import tqdm

from v4serve.bench.client import (
    StreamResult,
    chat_payload,
    completion_payload,
    fetch_models,
    first_model,
    make_http_client,
    normalize_base_url,
    stream_request,
)
from v4serve.bench.text import TokenText, default_text

METRICS = ("ttft", "tpot", "itl", "e2el")


@dataclass
class ServeBenchConfig:
    base_url: str
    model: str | None = None
    endpoint: str = "completions"  # or "chat"
    input_len: int = 1024
    output_len: int = 128
    range_ratio: float = 0.0  # lengths uniform in [len * (1 - r), len * (1 + r)]
    num_prompts: int = 100
    max_concurrency: int | None = None
    request_rate: float = float("inf")
    burstiness: float = 1.0  # gamma shape of inter-arrival times; 1 = Poisson
    num_warmups: int = 0
    seed: int = 0
    num_gpus: int = 1
    goodput: dict[str, float] = field(default_factory=dict)  # metric -> SLO in ms
    percentiles: tuple[float, ...] = (50.0, 90.0, 99.0)
    extra_body: dict[str, Any] | None = None
    request_timeout_s: float = 3600.0
    save_detailed: bool = False
    progress: bool = True
    api_key: str | None = field(default=None, repr=False)  # sent as a Bearer token; never written to reports


@dataclass(frozen=True)
class BenchRequest:
    prompt: str
    input_len: int
    output_len: int


def sample_requests(cfg: ServeBenchConfig, text: TokenText) -> list[BenchRequest]:
    """Random word prompts with distinct content (no prefix sharing between requests)."""
    rng = np.random.default_rng(cfg.seed)

    def lengths(center: int) -> np.ndarray:
        lo, hi = max(1, int(center * (1 - cfg.range_ratio))), max(1, int(center * (1 + cfg.range_ratio)))
        return rng.integers(lo, hi + 1, size=cfg.num_prompts)

    ins, outs = lengths(cfg.input_len), lengths(cfg.output_len)
    return [
        BenchRequest(text.generate(int(n_in), "serve", cfg.seed, i), int(n_in), int(n_out))
        for i, (n_in, n_out) in enumerate(zip(ins, outs, strict=True))
    ]


def parse_goodput(items: list[str] | None) -> dict[str, float]:
    """`["ttft:500", "tpot:50"]` -> {"ttft": 500.0, "tpot": 50.0} (milliseconds)."""
    out: dict[str, float] = {}
    for item in items or []:
        name, _, value = item.partition(":")
        if name not in ("ttft", "tpot", "e2el") or not value:
            raise ValueError(f"bad goodput SLO {item!r}; use ttft:MS, tpot:MS or e2el:MS")
        out[name] = float(value)
    return out


async def run_serve_bench(cfg: ServeBenchConfig, text: TokenText | None = None) -> dict[str, Any]:
    text = text or default_text()
    requests = sample_requests(cfg, text)
    base = normalize_base_url(cfg.base_url)
    url = f"{base}/v1/completions" if cfg.endpoint == "completions" else f"{base}/v1/chat/completions"
    async with make_http_client(cfg.request_timeout_s, cfg.api_key) as http:
        models = await fetch_models(http, base)
        model = cfg.model or first_model(models)

        def payload(req: BenchRequest) -> dict[str, Any]:
            if cfg.endpoint == "completions":
                return completion_payload(model, req.prompt, req.output_len, extra_body=cfg.extra_body)
            messages = [{"role": "user", "content": req.prompt}]
            return chat_payload(model, messages, req.output_len, extra_body=cfg.extra_body)

        for i in range(cfg.num_warmups):
            await stream_request(http, url, payload(requests[i % len(requests)]))

        semaphore = asyncio.Semaphore(cfg.max_concurrency or len(requests) or 1)
        inflight = max_inflight = 0
        bar = tqdm(
            total=len(requests), desc="bench serve", unit="req", disable=not cfg.progress, file=sys.stderr
        )

        async def one(req: BenchRequest) -> StreamResult:
            nonlocal inflight, max_inflight
            async with semaphore:
                inflight += 1
                max_inflight = max(max_inflight, inflight)
                try:
                    return await stream_request(http, url, payload(req))
                finally:
                    inflight -= 1
                    bar.update(1)

        rng = np.random.default_rng(cfg.seed + 1)
        start = time.perf_counter()
        tasks = []
        for req in requests:
            tasks.append(asyncio.create_task(one(req)))
            if cfg.request_rate != float("inf"):
                theta = 1.0 / (cfg.request_rate * cfg.burstiness)
                await asyncio.sleep(float(rng.gamma(cfg.burstiness, theta)))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
        bar.close()
    metrics = serve_metrics(results, duration, cfg)
    return {
        "date": time.strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": cfg.endpoint,
        "base_url": cfg.base_url,
        "model_id": model,
        "server_models": models,
        "num_prompts": cfg.num_prompts,
        "input_len": cfg.input_len,
        "output_len": cfg.output_len,
        "range_ratio": cfg.range_ratio,
        "request_rate": cfg.request_rate if cfg.request_rate != float("inf") else "inf",
        "burstiness": cfg.burstiness,
        "max_concurrency": cfg.max_concurrency,
        "max_concurrent_requests": max_inflight,
        "goodput_slos_ms": cfg.goodput,
        **metrics,
        **({"input_lens": [r.input_len for r in requests]} if cfg.save_detailed else {}),
    }


def serve_metrics(results: list[StreamResult], duration_s: float, cfg: ServeBenchConfig) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    tpots = [t for r in ok if (t := r.tpot_s) is not None]
    itls = [g for r in ok for g in r.itl_s]
    e2els = [r.e2el_s for r in ok]
    total_in = sum(r.prompt_tokens or 0 for r in ok)
    total_out = sum(r.completion_tokens or 0 for r in ok)
    good = sum(_meets(r, cfg.goodput) for r in ok) if cfg.goodput else None
    dur = max(duration_s, 1e-9)
    gpus = max(1, cfg.num_gpus)
    out: dict[str, Any] = {
        "duration": duration_s,
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) / dur,
        "request_goodput": (good / dur) if good is not None else None,
        "output_throughput": total_out / dur,
        "total_token_throughput": (total_in + total_out) / dur,
        "num_gpus": gpus,
        "output_throughput_per_gpu": total_out / dur / gpus,
        "total_token_throughput_per_gpu": (total_in + total_out) / dur / gpus,
    }
    for name, values in zip(METRICS, (ttfts, tpots, itls, e2els), strict=True):
        ms = np.asarray(values, dtype=float) * 1000.0
        out[f"mean_{name}_ms"] = float(ms.mean()) if ms.size else 0.0
        out[f"median_{name}_ms"] = float(np.median(ms)) if ms.size else 0.0
        out[f"std_{name}_ms"] = float(ms.std()) if ms.size else 0.0
        for q in cfg.percentiles:
            out[f"p{q:g}_{name}_ms"] = float(np.percentile(ms, q)) if ms.size else 0.0
    out["errors"] = sorted({r.error for r in results if r.error})[:10]
    if cfg.save_detailed:
        out |= {
            "output_lens": [r.completion_tokens for r in results],
            "ttfts": [r.ttft_s for r in results],
            "itls": [r.itl_s for r in results],
        }
    return out


def _meets(result: StreamResult, slos_ms: dict[str, float]) -> bool:
    values = {"ttft": result.ttft_s, "tpot": result.tpot_s, "e2el": result.e2el_s}
    return all(values[k] is not None and values[k] * 1000.0 <= slo for k, slo in slos_ms.items())


def format_summary(result: dict[str, Any]) -> str:
    """A console summary in the layout of `vllm bench serve`."""
    rows = [
        ("Successful requests:", result["completed"]),
        ("Failed requests:", result["failed"]),
        ("Maximum request concurrency:", result["max_concurrency"]),
        ("Benchmark duration (s):", f"{result['duration']:.2f}"),
        ("Total input tokens:", result["total_input_tokens"]),
        ("Total generated tokens:", result["total_output_tokens"]),
        ("Request throughput (req/s):", f"{result['request_throughput']:.2f}"),
    ]
    if result["request_goodput"] is not None:
        rows.append(("Request goodput (req/s):", f"{result['request_goodput']:.2f}"))
    rows += [
        ("Output token throughput (tok/s):", f"{result['output_throughput']:.2f}"),
        ("Total token throughput (tok/s):", f"{result['total_token_throughput']:.2f}"),
        ("Total token throughput per GPU (tok/s):", f"{result['total_token_throughput_per_gpu']:.2f}"),
    ]
    lines = ["{s:{c}^60}".format(s=" Serving Benchmark Result ", c="=")]
    lines += [f"{k:<45}{v!s:<15}" for k, v in rows]
    titles = {
        "ttft": "Time to First Token",
        "tpot": "Time per Output Token (excl. 1st token)",
        "itl": "Inter-token Latency",
        "e2el": "End-to-end Latency",
    }
    for name in METRICS:
        lines.append("{s:{c}^60}".format(s=f" {titles[name]} ", c="-"))
        for key in [f"mean_{name}_ms", f"median_{name}_ms"] + [
            k for k in result if k.startswith("p") and k.endswith(f"_{name}_ms")
        ]:
            label = key.replace(f"_{name}_ms", "").replace("_", " ").capitalize()
            lines.append(f"{label + ' ' + name.upper() + ' (ms):':<45}{result[key]:<15.2f}")
    lines.append("=" * 60)
    return "\n".join(lines)
