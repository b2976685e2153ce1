"""Where a CUDA-graph replay's time goes, kernel by kernel: the kernels of a few replays traced by torch.profiler
(CUPTI records a graph's kernel nodes one by one), laid on one time line per replay.

For each kernel: its duration, the idle time before it (from the latest end of every kernel before it to its start:
the GPU running nothing) and its exposed time (the part of it not overlapped by kernels that started earlier: with PDL
a kernel starts, and waits, while its predecessor runs). Idle + exposed over all kernels = the replay's span, so the
two columns say which kernels and which seams the step's time is spent on. Used by profile_step.py --replay-trace.
"""

from __future__ import annotations

from collections import defaultdict


def attribute(spans: list[tuple[str, float, float]]) -> dict:
    """spans: (name, start, end) of one replay's kernels in any order (any time unit) -> {"span", "busy", "idle",
    "kernels": {name: {"count", "duration", "idle_before", "exposed"}}, "sequence": [[name, duration, exposed,
    idle_before] per kernel in start order]}; idle + sum of exposed == span. The sequence tells the launches of one
    kernel apart (the decode GEMV runs every projection of a layer) by their place in the step."""
    spans = sorted(spans, key=lambda s: (s[1], s[2]))
    per: dict[str, dict[str, float]] = defaultdict(lambda: {"count": 0, "duration": 0.0, "idle_before": 0.0,
                                                            "exposed": 0.0})
    frontier = spans[0][1] if spans else 0.0
    idle = 0.0
    sequence = []
    for name, start, end in spans:
        k = per[name]
        k["count"] += 1
        k["duration"] += end - start
        gap = max(0.0, start - frontier)
        k["idle_before"] += gap
        idle += gap
        exposed = max(0.0, end - max(start, frontier))
        k["exposed"] += exposed
        frontier = max(frontier, end)
        sequence.append([name, end - start, exposed, gap])
    span = (frontier - spans[0][1]) if spans else 0.0
    return {"span": span, "busy": span - idle, "idle": idle, "kernels": dict(per), "sequence": sequence}


def merge(replays: list[dict]) -> dict:
    """The mean of attribute() over replays (the first replay's sequence)."""
    n = max(1, len(replays))
    out = {key: sum(r[key] for r in replays) / n for key in ("span", "busy", "idle")}
    kernels: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for r in replays:
        for name, k in r["kernels"].items():
            for key, v in k.items():
                kernels[name][key] += v / n
    out["kernels"] = {name: dict(k) for name, k in kernels.items()}
    out["sequence"] = replays[0]["sequence"] if replays else []
    return out


def table(result: dict, top: int = 25, unit: float = 1e3) -> list[str]:
    """Markdown rows (µs from ns by default: unit = ns per µs), by exposed + idle time, largest first."""
    lines = [f"replay span {result['span'] / unit:.1f} us: busy {result['busy'] / unit:.1f}, idle "
             f"{result['idle'] / unit:.1f}",
             "| kernel | per replay | duration us | exposed us | idle before us |", "|---|---|---|---|---|"]
    rows = sorted(result["kernels"].items(), key=lambda kv: -(kv[1]["exposed"] + kv[1]["idle_before"]))
    for name, k in rows[:top]:
        lines.append(f"| `{name[:90]}` | {k['count']:.0f} | {k['duration'] / unit:.1f} | {k['exposed'] / unit:.1f} | "
                     f"{k['idle_before'] / unit:.1f} |")
    return lines
