"""Offline throughput and decode step time of v4serve vs transformers, with the HBM floor (issue: the engine).

Runs on one GPU (or, tiny, on the CPU for a dry run):
    python benchmarks/offline.py --model v4-flash-l8-e16 --batches 1,8,32,128 --out $OUT
Every figure is printed as a table and written to OUT/offline.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from decoding import prompt_steps  # noqa: E402
from v4serve.engine.config import EngineConfig  # noqa: E402
from v4serve.engine.llm_engine import LLMEngine  # noqa: E402
from v4serve.engine.sampling_params import SamplingParams  # noqa: E402
from v4serve.info import parameter_counts  # noqa: E402
from v4serve.models.footprint import checkpoint_bytes, held_bytes  # noqa: E402
from v4serve.models.layout import tensor_specs  # noqa: E402

HBM = 4.3e12  # bytes/s, measured device-to-device copy on this H200 class (KINDS.md); re-measured below


def commit() -> str:
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(__file__) or ".").stdout.strip()
    except OSError:
        return "unknown"


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def measure_ceilings(dev: torch.device) -> dict[str, float]:
    if dev.type != "cuda":
        return {}
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    sync(dev)
    t = time.perf_counter()
    for _ in range(10):
        b.copy_(a)
    sync(dev)
    bw = 2 * n * 10 / (time.perf_counter() - t)
    x = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    for _ in range(3):
        x @ x
    sync(dev)
    t = time.perf_counter()
    for _ in range(10):
        x @ x
    sync(dev)
    tf = 2 * 8192**3 * 10 / (time.perf_counter() - t)
    del a, b, x
    return {"copy_bytes_per_s": bw, "bf16_flops": tf}


def active_weight_bytes(config, batch: int, bytes_per_param: float, expert_bytes_per_param: float) -> float:
    """Weights one decode step must read: dense + the experts a batch hits (expected distinct per layer)."""
    dense = expert = 0.0
    E, k = config.n_routed_experts, config.n_activated_experts
    hit = E * (1 - (1 - k / E) ** batch)
    for s in tensor_specs(config, include_mtp=False):
        if ".experts." in s.name:
            expert += s.numel * hit / E * expert_bytes_per_param
        elif s.name == "embed.weight":
            dense += s.shape[1] * batch * bytes_per_param
        else:
            dense += s.numel * (4 if s.kind == "f32" else bytes_per_param)
    return dense + expert


def kv_read_bytes(engine: LLMEngine, batch: int, context: int) -> float:
    """KV one decode step reads: every layer's window + CSA top-k entries and index keys + all HCA entries."""
    c = engine.model_config
    spec = engine.spec
    total = 0.0
    for lc in spec.layers:
        total += c.window_size * lc.window.record_bytes
        if lc.compressed is not None:
            n = context // lc.ratio
            sel = min(n, c.index_topk) if c.has_indexer(lc.layer) else n
            total += sel * lc.compressed.record_bytes
            if lc.index_keys is not None:
                total += n * lc.index_keys.record_bytes
    return total * batch


def bench_engine(args, dev: torch.device, results: dict) -> LLMEngine:
    cfg = EngineConfig(device=str(dev), max_num_seqs=max(args.batches), max_model_len=args.max_model_len,
                       kv_cache_memory=args.kv_cache_memory, max_num_batched_tokens=args.batched_tokens,
                       cuda_graph_sizes=tuple(args.batches), enforce_eager=args.eager,
                       enable_prefix_caching=False, seed=0, kernels=args.kernels)
    t = time.perf_counter()
    eng = LLMEngine(args.model, cfg)
    results["engine_load_s"] = time.perf_counter() - t
    results["capacity"] = eng.describe_capacity()
    held = held_bytes(eng.loaded.model)
    results["weight_bytes"] = held["device"] + held["host"]
    results["checkpoint_weight_bytes"] = sum(checkpoint_bytes(eng.model_config, include_mtp=cfg.with_mtp).values())
    print(results["capacity"], flush=True)
    print(f"weights held {results['weight_bytes'] / 1e9:.2f} GB, checkpoint {results['checkpoint_weight_bytes'] / 1e9:.2f} "
          f"GB", flush=True)
    g = torch.Generator().manual_seed(0)
    V = eng.model_config.vocab_size
    for b in args.batches:
        prompts = [torch.randint(0, V, (args.context,), generator=g).tolist() for _ in range(b)]
        # the rows prefilled first decode while the others prefill: their limit covers those steps, so that every timed
        # step has all b rows
        fill = prompt_steps(b, args.context, args.batched_tokens)
        sp = SamplingParams(max_tokens=args.decode_steps + 8 + fill, temperature=0, ignore_eos=True)
        for p in prompts:
            eng.add_request(p, sp)
        sync(dev)
        t = time.perf_counter()
        while any(r.in_prefill or r.num_computed == 0 for r in eng.scheduler.running) or eng.scheduler.waiting:
            eng.step()
        sync(dev)
        prefill_s = time.perf_counter() - t
        for _ in range(3):
            eng.step()
        sync(dev)
        t = time.perf_counter()
        for _ in range(args.decode_steps):
            eng.step()
        sync(dev)
        step_s = (time.perf_counter() - t) / args.decode_steps
        eng.abort_all()
        eng.step()
        for rid in list(eng.requests):
            eng.release(rid)
        c = eng.model_config
        floor_bf16 = (active_weight_bytes(c, b, 2, 2) + kv_read_bytes(eng, b, args.context)) / HBM
        floor_rel = (active_weight_bytes(c, b, 1, 0.5 + 1 / 32) + kv_read_bytes(eng, b, args.context)) / HBM
        results.setdefault("decode", {})[b] = {
            "step_ms": step_s * 1e3, "tok_per_s": b / step_s, "prefill_s": prefill_s,
            "prefill_tok_per_s": b * args.context / prefill_s,
            "hbm_floor_ms_bf16_weights": floor_bf16 * 1e3, "hbm_floor_ms_released_formats": floor_rel * 1e3,
            "vs_floor_bf16": step_s / floor_bf16}
        print(f"v4serve batch {b}: decode {step_s * 1e3:.2f} ms/step ({b / step_s:.0f} tok/s), floor "
              f"{floor_bf16 * 1e3:.2f} ms (bf16 weights) / {floor_rel * 1e3:.2f} ms (FP8/FP4); prefill "
              f"{b * args.context / prefill_s:.0f} tok/s", flush=True)
    if eng.runner.graphs is not None:
        results["graph_replays"] = eng.runner.graphs.replays
    # offline throughput: many requests at once
    n, il, ol = args.num_prompts, args.input_len, args.output_len
    prompts = [torch.randint(0, V, (il,), generator=g).tolist() for _ in range(n)]
    sp = SamplingParams(max_tokens=ol, temperature=0, ignore_eos=True)
    sync(dev)
    t = time.perf_counter()
    for p in prompts:
        eng.add_request(p, sp)
    while eng.has_unfinished():
        for d in eng.step():
            if d.finished:
                eng.release(d.request_id)
    sync(dev)
    dt = time.perf_counter() - t
    results["offline"] = {"num_prompts": n, "input_len": il, "output_len": ol, "seconds": dt,
                          "output_tok_per_s": n * ol / dt, "total_tok_per_s": n * (il + ol) / dt}
    print(f"v4serve offline {n} x ({il} in, {ol} out): {dt:.2f} s, {n * ol / dt:.0f} output tok/s, "
          f"{n * (il + ol) / dt:.0f} total tok/s", flush=True)
    return eng


def bench_transformers(args, dev: torch.device, results: dict) -> None:
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

    from v4serve.config import hf_config_dict
    from v4serve.models.checkpoint import transformers_layer_fields
    from v4serve.presets import get_preset

    c = get_preset(args.model)
    d = hf_config_dict(c, quantized=False)
    d.update(transformers_layer_fields(c))
    for k in ("architectures", "model_type", "compress_ratios", "num_hash_layers", "qk_rope_head_dim", "rope_scaling",
              "torch_dtype", "topk_method"):
        d.pop(k, None)
    d["partial_rotary_factor"] = c.rope_dim / c.head_dim
    d["rope_parameters"] = {"rope_type": "yarn", "factor": c.rope_factor,
                            "original_max_position_embeddings": c.original_seq_len, "beta_fast": c.beta_fast,
                            "beta_slow": c.beta_slow}
    hc = DeepseekV4Config(**d)
    with torch.device(dev):
        m = DeepseekV4ForCausalLM(hc).to(torch.bfloat16).eval()
    V = c.vocab_size
    out = {}
    with torch.inference_mode():
        x = torch.randint(0, V, (1, args.hf_prefill), device=dev)
        m(x)
        sync(dev)
        t = time.perf_counter()
        m(x)
        sync(dev)
        out["prefill_ms"] = (time.perf_counter() - t) * 1e3
        out["prefill_tokens"] = args.hf_prefill
        for b in [b for b in args.batches if b <= args.hf_max_batch]:
            ids = torch.randint(0, V, (b, args.context), device=dev)
            r = m(ids, use_cache=True)
            pkv = r.past_key_values
            nxt = r.logits[:, -1:].argmax(-1)
            steps = []
            for i in range(args.hf_decode_steps + 2):
                sync(dev)
                t = time.perf_counter()
                r = m(nxt, past_key_values=pkv, use_cache=True)
                sync(dev)
                steps.append(time.perf_counter() - t)
                pkv = r.past_key_values
                nxt = r.logits[:, -1:].argmax(-1)
            step = sorted(steps[2:])[len(steps[2:]) // 2]
            out.setdefault("decode_ms", {})[b] = step * 1e3
            print(f"transformers batch {b}: decode {step * 1e3:.2f} ms/step", flush=True)
    print(f"transformers prefill {args.hf_prefill} tokens: {out['prefill_ms']:.1f} ms", flush=True)
    results["transformers"] = out
    del m
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="v4-flash-l8-e16")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batches", default="1,8,32,128", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--decode-steps", type=int, default=20)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--kv-cache-memory", type=int, default=24 << 30)
    ap.add_argument("--batched-tokens", type=int, default=8192)
    ap.add_argument("--num-prompts", type=int, default=128)
    ap.add_argument("--input-len", type=int, default=1024)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--hf-prefill", type=int, default=2048)
    ap.add_argument("--hf-decode-steps", type=int, default=5)
    ap.add_argument("--hf-max-batch", type=int, default=32)
    ap.add_argument("--eager", action="store_true")
    ap.add_argument("--kernels", default="auto", help="auto (Triton on CUDA) or reference")
    ap.add_argument("--skip-transformers", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    dev = torch.device(args.device)
    results: dict = {"model": args.model, "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
                     "args": vars(args), "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    global HBM
    try:
        results["ceilings"] = measure_ceilings(dev)
        if results["ceilings"]:
            HBM = results["ceilings"]["copy_bytes_per_s"]
            print(f"ceilings: copy {HBM / 1e12:.2f} TB/s, bf16 matmul "
                  f"{results['ceilings']['bf16_flops'] / 1e12:.0f} TFLOP/s", flush=True)
    except Exception:
        traceback.print_exc()
    from v4serve.presets import get_preset

    results["params"] = parameter_counts(get_preset(args.model))
    for name, fn in (("engine", bench_engine), ("transformers", bench_transformers)):
        if name == "transformers" and args.skip_transformers:
            continue
        try:
            eng = fn(args, dev, results)
            if name == "engine":
                del eng
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
        except Exception:
            results[f"{name}_error"] = traceback.format_exc()
            traceback.print_exc()
    # the issue's prefill target: one prompt of --context tokens against transformers' eager forward of as many
    # (the last batch-1 entry: give --batches 1,1 so that the measured one runs warm)
    hf_pre, one = results.get("transformers", {}).get("prefill_ms"), results.get("decode", {}).get(1)
    if hf_pre and one and args.hf_prefill == args.context:
        ours = one["prefill_s"] * 1e3
        results["prefill_vs_transformers"] = {"tokens": args.context, "v4serve_ms": ours, "transformers_ms": hf_pre,
                                              "speedup": hf_pre / ours}
        print(f"prefill of {args.context} tokens: v4serve {ours:.1f} ms, transformers {hf_pre:.1f} ms "
              f"({hf_pre / ours:.1f}x)", flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "offline.json"), "w") as f:
        json.dump(results, f, indent=2, default=str)
    rows = [{"model": args.model, "batch": b, "decode_ms": r["step_ms"], "floor_ms": r["hbm_floor_ms_released_formats"],
             "prefill_tok_s": r["prefill_tok_per_s"], "weight_bytes": results.get("weight_bytes"),
             "checkpoint_weight_bytes": results.get("checkpoint_weight_bytes"), "commit": commit(),
             "kernels": args.kernels} for b, r in results.get("decode", {}).items()]
    with open(os.path.join(args.out, f"offline-{args.model}.json"), "w") as f:
        json.dump(rows, f, indent=2)
    dec, hf = results.get("decode", {}), results.get("transformers", {}).get("decode_ms", {})
    print("\n| batch | v4serve ms/step | tok/s | HBM floor bf16 (ms) | x floor | transformers ms/step | speedup |")
    print("|---|---|---|---|---|---|---|")
    for b, r in dec.items():
        h = hf.get(b)
        print(f"| {b} | {r['step_ms']:.2f} | {r['tok_per_s']:.0f} | {r['hbm_floor_ms_bf16_weights']:.2f} | "
              f"{r['vs_floor_bf16']:.1f} | {h if h is None else round(h, 2)} | "
              f"{'' if h is None else round(h / r['step_ms'], 1)} |")
    return 0 if not any(k.endswith("_error") for k in results) else 1


if __name__ == "__main__":
    math.isfinite(0.0)
    sys.exit(main())
