"""The `v4serve` command: serve | generate | info | make-checkpoint | bench | eval."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from .config import ConfigError
from .engine.config import KV_DTYPE_ALIASES
from .presets import DEMO_PRESET, PRESETS
from .sizes import parse_bytes, parse_tokens


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """Engine flags (vLLM's names where the meaning is the same); every one is also an `LLM(...)` keyword."""
    g = p.add_argument_group("engine")
    g.add_argument("--device", default="auto", help="auto (cuda if available), cuda, cuda:N or cpu")
    g.add_argument("--dtype", default="auto", help="compute dtype: auto (bf16 on GPU, float32 on CPU), bfloat16, float32")
    g.add_argument("--seed", type=int, default=0, help="seed of a preset's random weights")
    g.add_argument("--numerics", default="deepseek", choices=["deepseek", "transformers"],
                   help="follow DeepSeek's reference numerics (default) or transformers'")
    g.add_argument("--block-size", type=int, default=256, help="token positions per KV block (every cache kind)")
    g.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "bf16", "fp8", "fp4", *KV_DTYPE_ALIASES],
                   help="fp8: V4's 584 B records; fp4: V4.1's 288 B compressed entries; vLLM's bfloat16, fp8_e4m3 "
                        "and fp8_ds_mla are accepted (bf16, fp8, fp8)")
    g.add_argument("--index-cache-dtype", default=None, choices=["auto", "bf16", "fp8", "fp4"],
                   help="index keys: fp8 (132 B) or fp4 (68 B; default with a quantized KV cache)")
    g.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    g.add_argument("--kv-cache-memory", type=parse_bytes, default=None, help="bytes for the KV cache (e.g. 8GiB); any device")
    g.add_argument("--max-num-seqs", type=int, default=64)
    g.add_argument("--max-num-batched-tokens", type=int, default=8192)
    g.add_argument("--long-prefill-token-threshold", type=int, default=0,
                   help="max prefill tokens per request per step (0 = max-num-batched-tokens / 4, or the "
                        "whole budget for a request alone in the engine)")
    g.add_argument("--prefill-budget-with-decodes", type=int, default=0,
                   help="max prefill tokens in a step that also decodes (0 = no cap): keeps running requests' "
                        "inter-token latency while new prompts arrive, at the cost of their time to first token")
    g.add_argument("--target-itl-ms", type=float, default=0.0,
                   help="derive that cap from an inter-token-latency target, from measured step times (0 = off)")
    g.add_argument("--decode-steps-between-prefills", type=int, default=None, metavar="N",
                   help="let prefill join decoding requests only every N+1 steps, so that prompts arriving close "
                        "together share one step (fewer slow steps for running requests, a little more time to "
                        "first token; 0 = off; default 20 where decode steps run as CUDA graphs, else off)")
    g.add_argument("--max-prefill-delay-ms", type=float, default=150.0,
                   help="with --decode-steps-between-prefills: a prompt waiting this long joins the next step "
                        "(0 = no bound)")
    g.add_argument("--max-model-len", type=parse_tokens, default=None,
                   help="context length in tokens: 131072, 128k (128,000) or 128K (131,072)")
    g.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    g.add_argument("--swa-bounded-replay", action=argparse.BooleanOptionalAction, default=None,
                   help="V4.1: approximate SWA rebuild on prefix hits + trimmed decoder prefill (default on for "
                        "V4.1); --no-swa-bounded-replay is exact")
    g.add_argument("--num-window-checkpoints", type=int, default=None)
    g.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    g.add_argument("--cuda-graph-sizes", type=int, nargs="+", default=None, metavar="N",
                   help="decode batch sizes captured as CUDA graphs (default 1 2 4 8 16 32 64 128; a step of more "
                        "rows than the largest runs eagerly)")
    g.add_argument("--chunk-graph-tokens", type=int, nargs="+", default=None, metavar="T",
                   help="token buckets of CUDA graphs for steps with prompt tokens (e.g. 256 512 1024 2048; default "
                        "none: those steps run eagerly; one GPU only)")
    g.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=None,
                   help="compile the step's kernels before serving with a short scripted workload (default: on a "
                        "GPU); without it the first prefill chunks and mixed steps of each size stall the engine "
                        "while Triton compiles")
    g.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=True,
                   help="schedule and launch each step before the previous step's tokens reach the host (the host's "
                        "work overlaps the GPU's; world size 1; while a request wants logprobs, penalties or "
                        "structured output, the engine steps synchronously); on by default, "
                        "--no-async-scheduling steps synchronously")
    g.add_argument("--kernels", default="auto", choices=["auto", "triton", "reference"],
                   help="op bodies: auto (the Triton kernels on CUDA, the plain-torch reference elsewhere); "
                        "reference forces the plain-torch path")
    g.add_argument("--max-queue-len", type=int, default=1024)


ENGINE_ARGS = ("device", "dtype", "seed", "numerics", "block_size", "kv_cache_dtype", "index_cache_dtype",
               "gpu_memory_utilization", "kv_cache_memory", "max_num_seqs", "max_num_batched_tokens",
               "long_prefill_token_threshold", "max_model_len", "enable_prefix_caching", "swa_bounded_replay",
               "num_window_checkpoints", "enforce_eager", "warmup", "async_scheduling", "kernels", "max_queue_len",
               "tensor_parallel_size",
               "prefill_budget_with_decodes", "target_itl_ms", "decode_steps_between_prefills",
               "max_prefill_delay_ms", "nnodes", "master_addr", "master_port",
               "enable_expert_parallel", "data_parallel_size")


def engine_kwargs(args: argparse.Namespace) -> dict:
    kw = {k: getattr(args, k) for k in ENGINE_ARGS if hasattr(args, k)}
    if getattr(args, "cuda_graph_sizes", None):
        kw["cuda_graph_sizes"] = tuple(args.cuda_graph_sizes)
    if getattr(args, "chunk_graph_tokens", None):
        kw["chunk_graph_tokens"] = tuple(args.chunk_graph_tokens)
    return kw


def cmd_generate(args: argparse.Namespace) -> int:
    from . import LLM, SamplingParams

    kw = engine_kwargs(args)
    seed = kw.pop("seed")
    numerics = kw.pop("numerics")
    llm = LLM(args.model, seed=seed, numerics=numerics, **kw)
    sp = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                        top_k=args.top_k, seed=args.sampling_seed)
    prompts = args.prompt or ["Hello"]
    for out in llm.generate(prompts, sp):
        if args.json:
            print(json.dumps({"prompt": out.prompt, "text": out.text, "token_ids": out.token_ids,
                              "finish_reason": out.outputs[0].finish_reason}))
        else:
            print(f"--- prompt: {out.prompt!r}\n{out.text}\n--- {len(out.token_ids)} tokens, "
                  f"finish: {out.outputs[0].finish_reason}")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    from .info import format_info, model_info
    from .models.factory import resolve_config

    config, _ = resolve_config(args.model)
    info = model_info(config)
    if args.kv_cache_memory:
        from .info import capacity_info

        info["capacity"] = capacity_info(config, args.kv_cache_memory, args.kv_cache_dtype, args.block_size,
                                         args.max_num_seqs)
    if args.tensor_parallel_size > 1 or args.data_parallel_size > 1 or args.enable_expert_parallel or args.gpu_memory:
        from .info import H200_BYTES, parallel_info
        from .models.sharding import Layout

        layout = Layout(args.tensor_parallel_size, args.data_parallel_size, args.enable_expert_parallel)
        try:
            info["parallel"] = parallel_info(config, layout, args.gpu_memory or H200_BYTES,
                                             args.gpu_memory_utilization, args.kv_cache_dtype, args.block_size,
                                             args.max_num_seqs, engram_on_host=args.engram_on_host)
        except ValueError as e:
            print(f"v4serve info: {e}", file=sys.stderr)
            return 2
    print(json.dumps(info, indent=2) if args.json else format_info(info))
    return 0


def cmd_make_checkpoint(args: argparse.Namespace) -> int:
    from .models.checkpoint import write_checkpoint
    from .presets import get_preset

    config = get_preset(args.preset)
    out = write_checkpoint(config, args.out, seed=args.seed, dtype=args.dtype)
    print(f"wrote {args.preset} ({args.dtype}, seed {args.seed}) to {out}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from .server.launch import serve

    return serve(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="v4serve", description="Serve the DeepSeek-V4 model family.")
    p.add_argument("--log-level", default="INFO")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="OpenAI-compatible HTTP server")
    s.add_argument("model", nargs="?", default=None, help=f"preset ({', '.join(PRESETS)}) or checkpoint folder; "
                   f"default: the built-in demo model ({DEMO_PRESET})")
    from .server.args import add_server_args
    from .server.vllm_compat import add_vllm_args

    add_server_args(s)
    add_engine_args(s)
    add_vllm_args(s)
    s.set_defaults(func=cmd_serve)

    g = sub.add_parser("generate", help="generate text offline (no server)")
    g.add_argument("model", help="preset name or checkpoint folder")
    g.add_argument("--prompt", action="append", help="a prompt (repeat for several)")
    g.add_argument("--max-tokens", type=int, default=32)
    g.add_argument("--temperature", type=float, default=1.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--sampling-seed", type=int, default=None, help="per-request sampling seed")
    g.add_argument("--json", action="store_true")
    add_engine_args(g)
    g.set_defaults(func=cmd_generate)

    i = sub.add_parser("info", help="parameters, layer kinds, weight and KV-cache bytes (needs only config.json)")
    i.add_argument("model", help="preset name or a folder holding config.json")
    i.add_argument("--json", action="store_true")
    i.add_argument("--kv-cache-memory", type=parse_bytes, default=None,
                   help="also say how many tokens and 142K-token sessions a KV cache of this size holds")
    i.add_argument("--kv-cache-dtype", default="fp8", choices=["auto", "bf16", "fp8", "fp4"])
    i.add_argument("--block-size", type=int, default=256)
    i.add_argument("--max-num-seqs", type=int, default=64)
    i.add_argument("-tp", "--tensor-parallel-size", type=int, default=1,
                   help="size a deployment: weight bytes per GPU, KV cache left and sessions that fit")
    i.add_argument("-dp", "--data-parallel-size", type=int, default=1)
    i.add_argument("--enable-expert-parallel", action="store_true",
                   help="routed experts spread whole over all TP x DP GPUs (vLLM's flag)")
    i.add_argument("--gpu-memory", type=parse_bytes, default=None,
                   help="memory of one GPU for the sizing (default: an H200's 140.4 GiB)")
    i.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    i.add_argument("--engram-on-host", action="store_true",
                   help="V4.1: size with the Engram tables in host memory (the engine's V4SERVE_ENGRAM_ON_HOST=1)")
    i.set_defaults(func=cmd_info)

    m = sub.add_parser("make-checkpoint", help="write a random checkpoint in the official layout")
    m.add_argument("--preset", required=True, choices=sorted(PRESETS))
    m.add_argument("--out", required=True, type=Path)
    m.add_argument("--dtype", default="fp8", choices=["fp8", "bfloat16", "float32"])
    m.add_argument("--seed", type=int, default=0)
    m.set_defaults(func=cmd_make_checkpoint)

    from .bench.cli import register_bench
    from .eval.cli import register_eval

    register_bench(sub)
    register_eval(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except (ConfigError, ValueError, FileNotFoundError) as e:
        print(f"v4serve {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
