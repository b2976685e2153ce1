"""Step times by step kind, cumulative: what a running request's inter-token latency is made of.

Every decoding row waits for the whole step it rides in, so the slow tail of inter-token latency is the share of steps
that carry prefill work beside decodes and how long those take. Three kinds: `decode` (decode rows only: a CUDA graph
where captured), `mixed` (decode rows and prefill tokens: eager) and `prefill` (prefill only: nobody waits on it).
Counters only grow, so the periodic stats line and `/metrics` can both read them (the line takes differences between
two readings) without one resetting the other's view.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

KINDS = ("decode", "mixed", "prefill")
# upper bucket edges, seconds: fine where graphed decode steps land (1-10 ms), coarse for eager prefill steps
EDGES = (0.001, 0.002, 0.003, 0.004, 0.005, 0.0067, 0.008, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0,
         2.0, 5.0)


def kind(decode_rows: int, prefill_tokens: int) -> str:
    if decode_rows and prefill_tokens:
        return "mixed"
    return "decode" if decode_rows else "prefill"


@dataclass
class KindCounts:
    count: int = 0
    seconds: float = 0.0
    prefill_tokens: int = 0
    buckets: list[int] = field(default_factory=lambda: [0] * (len(EDGES) + 1))  # the last: over EDGES[-1]

    def add(self, seconds: float, prefill_tokens: int) -> None:
        self.count += 1
        self.seconds += seconds
        self.prefill_tokens += prefill_tokens
        self.buckets[bisect.bisect_left(EDGES, seconds)] += 1

    def as_dict(self) -> dict[str, object]:
        return {"count": self.count, "seconds": self.seconds, "prefill_tokens": self.prefill_tokens,
                "buckets": list(self.buckets)}


class StepStats:
    def __init__(self) -> None:
        self.kinds = {k: KindCounts() for k in KINDS}

    def observe(self, decode_rows: int, prefill_tokens: int, seconds: float) -> None:
        self.kinds[kind(decode_rows, prefill_tokens)].add(seconds, prefill_tokens)

    def as_dict(self) -> dict[str, dict[str, object]]:
        return {k: c.as_dict() for k, c in self.kinds.items()}


def bucket_quantile(buckets: list[int], q: float) -> float | None:
    """The upper edge of the bucket holding quantile q (0-1) of the counts; None without counts, inf past the last
    edge. A bound, not an interpolation: 'p90 <= 8 ms'."""
    total = sum(buckets)
    if total == 0:
        return None
    need = q * total
    seen = 0
    for i, n in enumerate(buckets):
        seen += n
        if seen >= need and n:
            return EDGES[i] if i < len(EDGES) else float("inf")
    return float("inf")


def interval_line(prev: dict[str, dict] | None, now: dict[str, dict]) -> str:
    """'steps: decode 412 (p50 <= 3 / p90 <= 4 ms), mixed 31 (...; 480 prefill tokens each), prefill 2 (...)' for the
    steps between two readings (prev None: since start); kinds without steps are left out."""
    parts = []
    for k in KINDS:
        cur = now.get(k)
        if not cur:
            continue
        old = (prev or {}).get(k) or {"count": 0, "prefill_tokens": 0, "buckets": [0] * len(cur["buckets"])}
        n = cur["count"] - old["count"]
        if n <= 0:
            continue
        b = [x - y for x, y in zip(cur["buckets"], old["buckets"])]
        p50, p90 = bucket_quantile(b, 0.5), bucket_quantile(b, 0.9)
        text = f"{k} {n} (p50 <= {_ms(p50)} / p90 <= {_ms(p90)} ms"
        if k == "mixed":
            text += f"; {(cur['prefill_tokens'] - old['prefill_tokens']) / n:.0f} prefill tokens each"
        parts.append(text + ")")
    return "steps: " + ", ".join(parts) if parts else ""


def _ms(s: float | None) -> str:
    if s is None:
        return "-"
    return "inf" if s == float("inf") else f"{s * 1e3:g}"
