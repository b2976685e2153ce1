"""The hardware floor of a step, by op family: the bytes a decode step must read and the FLOPs a prefill chunk must do.

Weights count in their release formats (FP8 + e8m0 block scales, FP4 + per-32 scales, bf16 where released so);
routed experts count as the distinct experts a batch of `batch` tokens hits in expectation (E * (1 - (1 - k/E)^B));
the KV a decode step reads is every layer's window, the CSA top-k entries and all index keys of the visible entries,
and all HCA entries. A family's floor time is max(bytes / HBM, FLOPs / peak) with the ceilings measured in the run.
Linear GEMMs count as `linear` wherever they sit (the profiler attributes a kernel to the innermost range), so the
compressor and indexer rows hold only their own non-GEMM work.
"""

from __future__ import annotations

import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from v4serve.config import ModelConfig  # noqa: E402
from v4serve.models.footprint import stored_bytes  # noqa: E402
from v4serve.models.layout import tensor_specs  # noqa: E402


def expected_hit(E: int, k: int, tokens: int) -> float:
    """Expected number of distinct experts among `tokens` tokens each routed to k of E (uniform)."""
    return E * (1 - (1 - k / E) ** tokens)


def _family_of(name: str, kind: str) -> str:
    if ".experts." in name:
        return "moe"
    if name.endswith(("gate.weight", "gate.bias", "gate.bias_vl", "tid2eid")):
        return "router"
    if "hc_" in name:
        return "mhc"
    if name == "embed.weight" or kind == "engram":
        return "other"
    if name.endswith(".weight") and kind in ("dense", "bf16") and not name.endswith("norm.weight"):
        return "linear"
    return "norm/rope/quant"  # norms, sinks, APE: a few KB per layer


def decode_bytes(c: ModelConfig, spec, batch: int, context: int) -> dict[str, float]:
    """Bytes one decode step of `batch` rows at `context` must read, by family (spec: the engine's cache spec)."""
    out: dict[str, float] = defaultdict(float)
    hit = expected_hit(c.n_routed_experts, c.n_activated_experts, batch) / c.n_routed_experts
    for s in tensor_specs(c, include_mtp=False):
        fam = _family_of(s.name, s.kind)
        b = sum(stored_bytes(s, c).values())
        if fam == "moe":
            b *= hit
        elif s.name == "embed.weight" or s.kind == "engram":
            b = b / s.shape[0] * batch * (1 if s.name == "embed.weight" else 24)
        elif s.name.endswith("tid2eid"):
            b = b / s.shape[0] * batch
        out[fam] += b
    for lc in spec.layers:
        out["attention"] += batch * c.window_size * lc.window.record_bytes
        if lc.compressed is not None:
            n = context // lc.ratio
            sel = min(n, c.index_topk) if c.has_indexer(lc.layer) else n
            out["attention"] += batch * sel * lc.compressed.record_bytes
            if lc.index_keys is not None:
                out["indexer"] += batch * n * lc.index_keys.record_bytes
    out["sampling"] += batch * c.vocab_size * 4
    return dict(out)


def prefill_flops(c: ModelConfig, tokens: int, context: int) -> dict[str, float]:
    """FLOPs of a prefill chunk of `tokens` tokens ending at `context` (one request), by family."""
    out: dict[str, float] = defaultdict(float)
    k, E = c.n_activated_experts, c.n_routed_experts
    for s in tensor_specs(c, include_mtp=False):
        fam = _family_of(s.name, s.kind)
        if s.name == "head.weight":
            out["linear"] += 2 * s.numel  # one row of logits per request
        elif fam == "linear":
            out["linear"] += 2 * tokens * s.numel
        elif fam == "moe":
            out["moe"] += 2 * tokens * s.numel * k / E
        elif fam == "router" and s.name.endswith("gate.weight"):
            out["router"] += 2 * tokens * s.numel
        elif fam == "mhc" and s.name.endswith("_fn"):
            out["mhc"] += 2 * tokens * s.numel
    avg_ctx = context - tokens / 2
    for i in range(c.n_layers):
        r = c.compress_ratios[i]
        keys = min(avg_ctx, c.window_size)
        if r:
            n = avg_ctx / r
            keys += min(n, c.index_topk) if c.has_indexer(i) else n
            if c.has_indexer(i):
                out["indexer"] += 2 * tokens * c.index_n_heads * c.index_head_dim * n
        out["attention"] += 4 * tokens * c.n_heads * c.head_dim * keys
    return dict(out)


FP8_FAMILIES = ("linear", "moe")  # run on FP8 tensor cores in the fast path; the rest at the bf16 rate


def floor_ms(bytes_: dict[str, float], flops: dict[str, float], ceil: dict[str, float]) -> dict[str, float]:
    fams = set(bytes_) | set(flops)
    out = {}
    for f in fams:
        peak = ceil["fp8_flops"] if f in FP8_FAMILIES else ceil["bf16_flops"]
        out[f] = max(bytes_.get(f, 0.0) / ceil["hbm_bytes_per_s"], flops.get(f, 0.0) / peak) * 1e3
    return out
