"""Agentic benchmark results: one JSON document per run, a Markdown table and a PNG plot.

The plot is the AgentX chart: TPGS (y) against p90 interactivity (x), one marker per concurrency
point, one line per run; several runs (replay on/off, v4serve vs another server) can be overlaid.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from v4serve.bench.metrics import best_under_slo

SCHEMA = "v4serve.bench.agentic/v1"


def agentic_document(
    *,
    points: Sequence[dict[str, Any]],
    model: str,
    base_url: str,
    server_models: dict[str, Any],
    num_gpus: int,
    config: dict[str, Any],
    trace: dict[str, Any],
    command: Sequence[str],
    started_at: float,
    wall_s: float,
    slo_interactivity: Sequence[float] = (150.0, 50.0),
    label: str | None = None,
) -> dict[str, Any]:
    points = list(points)
    return {
        "schema": SCHEMA,
        "label": label or model,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started_at)),
        "command": list(command),
        "base_url": base_url,
        "model": model,
        "server_models": server_models,
        "num_gpus": num_gpus,
        "config": config,
        "trace": trace,
        "points": points,
        "slo": [{"min_interactivity_p90": s, "best": best_under_slo(points, s)} for s in slo_interactivity],
        "wall_s": wall_s,
    }


def write_agentic_report(
    doc: dict[str, Any],
    out_dir: str | Path,
    overlays: Sequence[dict[str, Any]] = (),
    records: Sequence[Any] = (),
) -> dict[str, Path]:
    """Write `agentic-<time>.{json,md,png}` (and `-records.jsonl` when records are given)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = "agentic-" + doc["created"][:19].replace(":", "").replace("-", "").replace("T", "-")
    paths = {"json": out / f"{stem}.json", "markdown": out / f"{stem}.md", "png": out / f"{stem}.png"}
    paths["json"].write_text(json.dumps(doc, indent=2, default=str) + "\n")
    paths["markdown"].write_text(markdown_report(doc))
    plot_runs([doc, *overlays], paths["png"])
    if records:
        paths["records"] = out / f"{stem}-records.jsonl"
        with paths["records"].open("w") as f:
            for record in records:
                f.write(json.dumps(asdict(record)) + "\n")
    return paths


def _fmt(value: float | None, digits: int = 1, scale: float = 1.0) -> str:
    return "-" if value is None else f"{value * scale:,.{digits}f}"


def markdown_report(doc: dict[str, Any]) -> str:
    stats = doc.get("trace", {}).get("stats", {})
    lines = [
        f"# Agentic benchmark: {doc['label']}",
        "",
        f"- model `{doc['model']}` at {doc['base_url']}, {doc['num_gpus']} GPU(s), {doc['created']}",
        (
            f"- trace `{doc.get('trace', {}).get('source', '?')}`: median input {_fmt(stats.get('input_median'), 0)}, "
            f"median output {_fmt(stats.get('output_median'), 0)}, "
            f"theoretical reuse {_fmt(stats.get('reuse_token_weighted'), 1, 100)}%"
        ),
        f"- command: `{' '.join(doc['command'])}`",
        "",
        (
            "| conc | done | err % | TPGS | out tok/s/GPU | inter p50 | inter p90 | TTFT p50 / p90 / p99 (s) "
            "| TPOT p50 (ms) | E2EL p50 / p90 (s) | hit % server / theory | max in-flight |"
        ),
        "|---:|---:|---:|---:|---:|---:|---:|---|---:|---|---|---:|",
    ]
    for p in doc["points"]:
        ttft, e2el = p["ttft_ms"], p["e2el_ms"]
        lines.append(
            f"| {p['concurrency']} | {p['requests_completed']} | {_fmt(p['error_rate'], 1, 100)} | {_fmt(p['tpgs'], 0)} "
            f"| {_fmt(p['output_tps_per_gpu'], 1)} | {_fmt(p['interactivity_p50'])} | {_fmt(p['interactivity_p90'])} "
            f"| {_fmt(ttft['p50'], 2, 1e-3)} / {_fmt(ttft['p90'], 2, 1e-3)} / {_fmt(ttft['p99'], 2, 1e-3)} "
            f"| {_fmt(p['tpot_ms']['p50'])} | {_fmt(e2el['p50'], 2, 1e-3)} / {_fmt(e2el['p90'], 2, 1e-3)} "
            f"| {_fmt(p['hit_rate'], 1, 100)} / {_fmt(p['theoretical_hit_rate'], 1, 100)} | {p['max_inflight']} |"
        )
    lines.append("")
    for slo in doc.get("slo", []):
        best = slo["best"]
        target = f"p90 interactivity >= {slo['min_interactivity_p90']:g} tok/s/user"
        if best is None:
            lines.append(f"- {target}: no point meets it")
        else:
            lines.append(
                f"- {target}: best TPGS {best['tpgs']:,.0f} at concurrency {best['concurrency']} "
                f"(p90 interactivity {best['interactivity_p90']:.1f})"
            )
    return "\n".join(lines) + "\n"


def plot_runs(docs: Sequence[dict[str, Any]], path: str | Path, title: str | None = None) -> Path:
    """TPGS against p90 interactivity, one line per run document."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=120)
    for doc in docs:
        pts = sorted(
            (p for p in doc["points"] if p.get("interactivity_p90") is not None),
            key=lambda p: p["interactivity_p90"],
        )
        if not pts:
            continue
        xs = [p["interactivity_p90"] for p in pts]
        ys = [p["tpgs"] for p in pts]
        (line,) = ax.plot(xs, ys, marker="o", label=doc.get("label", doc.get("model", "run")))
        for p, x, y in zip(pts, xs, ys, strict=True):
            ax.annotate(
                f"c{p['concurrency']}",
                (x, y),
                textcoords="offset points",
                xytext=(4, 4),
                fontsize=8,
                color=line.get_color(),
            )
    for slo in docs[0].get("slo", []) if docs else []:
        ax.axvline(slo["min_interactivity_p90"], color="grey", linestyle="--", linewidth=0.8)
    ax.set_xlabel("p90 interactivity (tok/s/user = 1 / p90 ITL)")
    ax.set_ylabel("TPGS (input incl. cached + output tok/s/GPU)")
    ax.set_title(title or "Agentic throughput vs interactivity")
    ax.grid(True, alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return Path(path)


def load_documents(paths: Sequence[str | Path], labels: Sequence[str] = ()) -> list[dict[str, Any]]:
    docs = [json.loads(Path(p).read_text()) for p in paths]
    for doc, label in zip(docs, labels, strict=False):
        doc["label"] = label
    return docs
