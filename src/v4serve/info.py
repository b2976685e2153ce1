"""`v4serve info`: parameters, layer kinds, weight bytes and KV-cache bytes, all computed from the config."""

from __future__ import annotations

from collections import Counter
from typing import Any

from .cache.spec import make_cache_spec
from .config import ModelConfig
from .models.footprint import checkpoint_bytes, engine_bytes, stored_bytes
from .models.layout import TensorSpec, tensor_specs
from .models.sharding import Layout, check_layout, model_rules, rank_fraction


def layer_kinds(c: ModelConfig) -> list[str]:
    out = []
    for i in range(c.n_layers):
        r = c.ratio(i)
        if r == 0:
            out.append("window")
        elif not c.is_v41:
            out.append(f"CSA (ratio {r}, indexer)" if r == 4 else f"HCA (ratio {r})")
        else:
            role = "KV source" if c.owns_compressor(i) else f"reads layer {c.kv_source(i)}"
            idx = "index source" if c.runs_indexer(i) else f"top-k of layer {c.index_source(i)}"
            dec = ", decoder" if i >= c.decoder_start else ""
            out.append(f"CSA2 ratio {r}: {role}; {idx}{dec}")
    return out


def _is_active(spec: TensorSpec, c: ModelConfig) -> float:
    """Fraction of a tensor a token touches: routed experts are used by top-k of n; the vocab tables by one row."""
    if ".experts." in spec.name:
        return c.n_activated_experts / c.n_routed_experts
    if spec.name == "embed.weight" or spec.kind == "engram" or spec.name.endswith("tid2eid"):
        return 1.0 / spec.shape[0]
    return 1.0


def parameter_counts(c: ModelConfig) -> dict[str, int]:
    specs = tensor_specs(c, include_mtp=True)
    trunk = [s for s in specs if not s.name.startswith("mtp.")]
    total = sum(s.numel for s in trunk)
    mtp = sum(s.numel for s in specs if s.name.startswith("mtp."))
    active = int(sum(s.numel * _is_active(s, c) for s in trunk))
    out = {"total": total, "mtp_or_draft": mtp, "active_per_token": active}
    if c.is_v41:
        from .models.v41.accounting import active_params

        ap = active_params(c)
        out["active_per_prompt_token"] = ap["prefill_per_token"]
        out["active_per_generated_token"] = ap["decode_per_token"]
        out["active_per_token"] = ap["decode_per_token"]
    return out


def weight_bytes(c: ModelConfig, quantized: bool = True) -> dict[str, int]:
    return checkpoint_bytes(c, include_mtp=True, storage="fp8" if quantized else "bfloat16")


def kv_formats(c: ModelConfig) -> dict[str, dict[str, float]]:
    """KV bytes per token (growing part) and per sequence (window, compressor state) for each record format."""
    combos = [("bf16", "bf16"), ("fp8", "fp8"), ("fp8", "fp4")] if not c.is_v41 else [("bf16", "bf16"), ("fp4", "fp4")]
    out = {}
    for kv, idx in combos:
        spec = make_cache_spec(c, block_size=256, kv_dtype=kv, index_dtype=idx)
        out[f"kv={kv}, index={idx}"] = spec.by_kind()
    return out


def model_info(c: ModelConfig) -> dict[str, Any]:
    info: dict[str, Any] = {
        "name": c.name, "family": c.family, "layers": c.n_layers, "hidden": c.dim,
        "parameters": parameter_counts(c),
        "layer_kinds": layer_kinds(c),
        "layer_kind_counts": dict(Counter(k.split(":")[0] for k in layer_kinds(c))),
        "weight_bytes": weight_bytes(c, quantized=True),
        "kv_cache": kv_formats(c),
    }
    info["weight_bytes"]["total"] = sum(v for k, v in info["weight_bytes"].items() if k != "total")
    info["engine_weight_bytes"] = engine_bytes(c, include_mtp=True)  # held on the GPU: stored formats, bf16 compute
    if c.is_v41:
        from .models.v41.accounting import engram_row_counts

        info["engram_rows"] = dict(zip(map(str, c.engram_layers), engram_row_counts(c)))
        info["decoder_layers"] = f"{c.decoder_start}..{c.n_layers - 1}"
    return info


def capacity_info(c: ModelConfig, kv_bytes: int, kv_dtype: str, block_size: int, max_num_seqs: int) -> dict[str, Any]:
    """What a KV cache of `kv_bytes` holds, with the engine's own split between slots and blocks."""
    import torch

    from .engine.config import EngineConfig
    from .engine.llm_engine import AGENTX_SESSION_TOKENS, plan_capacity

    if c.is_v41 and kv_dtype == "fp8":
        kv_dtype = "fp4"  # V4.1's compressed format
    cfg = EngineConfig(kv_cache_memory=kv_bytes, kv_cache_dtype=kv_dtype, block_size=block_size,
                       max_num_seqs=max_num_seqs, swa_bounded_replay=c.is_v41)
    spec = make_cache_spec(c, block_size, kv_dtype, None, torch.bfloat16)
    cap = plan_capacity(spec, cfg, kv_bytes, c.max_position)
    return {"kv_cache_bytes": kv_bytes, "kv_cache_dtype": kv_dtype, "blocks": cap.num_blocks,
            "tokens": cap.tokens(block_size), "slots": cap.num_slots, "window_checkpoints": cap.num_checkpoints,
            f"sessions_of_{AGENTX_SESSION_TOKENS}_tokens": cap.sessions(block_size)}


H200_BYTES = 143_771 * 2**20  # what an H200 reports (torch.cuda.mem_get_info total)


def parallel_info(c: ModelConfig, layout: Layout, gpu_memory: int = H200_BYTES, utilization: float = 0.9,
                  kv_dtype: str = "fp8", block_size: int = 256, max_num_seqs: int = 64,
                  step_tokens: int = 8192, engram_on_host: bool = False) -> dict[str, Any]:
    """Per-GPU weight bytes under a parallel layout (models/sharding.py), the KV cache each GPU has left, and the
    sessions that fit: TP ranks hold the same KV (one KV head, replicated compressed caches), DP ranks each their own.
    """
    from .engine.memory import activation_reserve

    check_layout(c, layout)
    rules = model_rules(c)  # the splits the model's layers declare (a skeleton on the meta device)
    per_gpu = host = 0.0
    for spec in tensor_specs(c, include_mtp=True):
        b = sum(stored_bytes(spec, c).values())
        if engram_on_host and spec.kind == "engram":
            host += b  # each host holds the whole tables (their rows travel per step, not the tables)
        else:
            per_gpu += b * rank_fraction(spec, c, layout, rules)
    reserve = activation_reserve(c, step_tokens, (c.n_routed_experts // layout.expert_ranks, c.moe_inter_dim))
    kv = int(utilization * gpu_memory - per_gpu - reserve)
    out: dict[str, Any] = {"layout": layout.describe(), "gpus": layout.gpus, "gpu_memory_bytes": gpu_memory,
                           "weight_bytes_per_gpu": int(per_gpu), "host_weight_bytes": int(host),
                           "activation_reserve_bytes": reserve,
                           "kv_cache_bytes_per_gpu": max(kv, 0), "fits": kv > 0}
    if kv > 0:
        cap = capacity_info(c, kv, kv_dtype, block_size, max_num_seqs)
        key = next(k for k in cap if k.startswith("sessions_of_"))
        out["capacity_per_dp_rank"] = cap
        out["sessions_total"] = cap[key] * layout.data_parallel
    return out


def format_info(info: dict[str, Any]) -> str:
    p = info["parameters"]
    lines = [f"{info['name']} ({info['family']}): {info['layers']} layers, hidden {info['hidden']}",
             f"parameters: {p['total'] / 1e9:.2f}B total (+{p['mtp_or_draft'] / 1e9:.2f}B MTP/draft)"]
    if "active_per_prompt_token" in p:
        lines.append(f"active per prompt token: {p['active_per_prompt_token'] / 1e9:.2f}B; "
                     f"per generated token: {p['active_per_generated_token'] / 1e9:.2f}B")
    else:
        lines.append(f"active per token: {p['active_per_token'] / 1e9:.2f}B")
    lines.append("layer kinds: " + ", ".join(f"{k} x{n}" for k, n in info["layer_kind_counts"].items()))
    wb = info["weight_bytes"]
    lines.append("weight bytes (released formats): " + ", ".join(
        f"{k} {v / 1e9:.2f} GB" for k, v in wb.items() if k != "total") + f"; total {wb['total'] / 1e9:.2f} GB")
    lines.append(f"weight bytes held by the engine (stored formats; norms and mHC widened to float32): "
                 f"{info['engine_weight_bytes'] / 1e9:.2f} GB ({info['engine_weight_bytes'] / wb['total']:.3f}x)")
    lines.append("KV cache:")
    for name, d in info["kv_cache"].items():
        lines.append(f"  {name}: {d['total_per_token']:.2f} B/token ({d['compressed_entries_per_token']:.2f} "
                     f"compressed + {d['index_keys_per_token']:.2f} index keys); per sequence "
                     f"{d['window_per_sequence'] / 2**20:.2f} MiB window + "
                     f"{d['compressor_state_per_sequence'] / 2**20:.2f} MiB compressor state")
    if "capacity" in info:
        cap = info["capacity"]
        n_sessions = next(v for k, v in cap.items() if k.startswith("sessions_of_"))
        lines.append(f"a {cap['kv_cache_bytes'] / 2**30:.1f} GiB KV cache ({cap['kv_cache_dtype']}): {cap['blocks']:,} "
                     f"blocks = {cap['tokens']:,} tokens, {cap['slots']} slots ({cap['window_checkpoints']} window "
                     f"checkpoints); holds {n_sessions} AgentX-median sessions of 142,000 tokens")
    if "parallel" in info:
        p = info["parallel"]
        head = (f"{p['layout']} on {p['gpus']} GPU(s) of {p['gpu_memory_bytes'] / 2**30:.1f} GiB: weights "
                f"{p['weight_bytes_per_gpu'] / 1e9:.2f} GB per GPU"
                + (f" (+ {p['host_weight_bytes'] / 1e9:.1f} GB of Engram tables in host memory)"
                   if p["host_weight_bytes"] else "") + ", activations reserve "
                f"{p['activation_reserve_bytes'] / 2**30:.1f} GiB")
        if not p["fits"]:
            lines.append(head + "; does NOT fit (no memory left for a KV cache): use more GPUs or expert parallel")
        else:
            cap = p["capacity_per_dp_rank"]
            lines.append(head + f", KV cache {p['kv_cache_bytes_per_gpu'] / 2**30:.1f} GiB per GPU = "
                         f"{cap['tokens']:,} tokens per data-parallel rank; holds {p['sessions_total']} AgentX-median "
                         f"sessions of 142,000 tokens in all")
    if "engram_rows" in info:
        lines.append("Engram rows: " + ", ".join(f"layer {k}: {v:,}" for k, v in info["engram_rows"].items()))
        lines.append(f"decoder layers (trimmed prefill): {info['decoder_layers']}")
    return "\n".join(lines)
