"""vLLM's command line for DeepSeek-V4, accepted by `v4serve serve`.

People run e.g. `vllm serve deepseek-ai/DeepSeek-V4-Flash --tensor-parallel-size 8 --kv-cache-dtype fp8
--tokenizer-mode deepseek_v4 --tool-call-parser deepseek_v4 --enable-auto-tool-choice --reasoning-parser
deepseek_v4`; the same flags start v4serve. Each one either maps onto v4serve's own option, is accepted with one
log line saying what v4serve does instead, or (what v4serve cannot do yet) stops with a message saying so.
docs/vllm.md lists them all.
"""

from __future__ import annotations

import argparse
import json
import logging

from ..sizes import parse_bytes

log = logging.getLogger("v4serve.server")

# accepted for compatibility: what v4serve does instead (one log line each when given)
NOTED = {
    "trust_remote_code": "--trust-remote-code: not needed; v4serve runs its own DeepSeek-V4 code",
    "tokenizer_mode": "--tokenizer-mode: v4serve always uses the checkpoint's tokenizer with DeepSeek-V4's chat "
                      "encoder",
    "tool_call_parser": "--tool-call-parser: v4serve always parses DeepSeek-V4's DSML tool calls",
    "enable_auto_tool_choice": "--enable-auto-tool-choice: tool calls are always parsed when tools are given",
    "reasoning_parser": "--reasoning-parser: v4serve always separates reasoning (reasoning_content and reasoning)",
}


def _json_list(text: str) -> list[str]:
    try:
        value = json.loads(text)
    except ValueError:
        value = [v.strip() for v in text.split(",") if v.strip()]
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise argparse.ArgumentTypeError(f"expected a JSON list of strings, e.g. '[\"*\"]', got {text!r}")
    return value


def add_vllm_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("vLLM compatibility")
    g.add_argument("--model", dest="model_flag", default=None, metavar="MODEL",
                   help="the model (as vLLM's --model); same as the positional MODEL")
    g.add_argument("-tp", "--tensor-parallel-size", type=int, default=1)
    g.add_argument("-dp", "--data-parallel-size", type=int, default=1)
    g.add_argument("--nnodes", type=int, default=1, help="machines the ranks (TP or DEP) span (docs/parallel.md)")
    g.add_argument("--node-rank", type=int, default=0,
                   help="this machine's index: 0 serves HTTP and runs the engine, the others run their ranks only")
    g.add_argument("--master-addr", default=None, help="rank 0's address, reachable from every node")
    g.add_argument("--master-port", type=int, default=None)
    g.add_argument("--enable-expert-parallel", action="store_true")
    g.add_argument("--kv-cache-memory-bytes", type=parse_bytes, default=None,
                   help="vLLM's name for --kv-cache-memory")
    g.add_argument("--speculative-config", type=json.loads, default=None,
                   help="JSON (vLLM); speculative decoding is not available yet: a clear error")
    g.add_argument("--trust-remote-code", action="store_true")
    g.add_argument("--tokenizer-mode", default=None)
    g.add_argument("--tool-call-parser", default=None)
    g.add_argument("--enable-auto-tool-choice", action="store_true")
    g.add_argument("--reasoning-parser", default=None)
    g.add_argument("--enable-log-requests", action="store_true", help="log every request (method, path, client)")
    g.add_argument("--disable-log-stats", action="store_true", help="no periodic stats line")
    g.add_argument("--log-stats-interval", type=float, default=10.0,
                   help="seconds between stats lines (throughput, running / waiting, KV use, prefix hits)")
    g.add_argument("--disable-uvicorn-access-log", action="store_true", help="same as --no-access-log")
    g.add_argument("--allowed-origins", type=_json_list, default=None,
                   help="CORS: allowed origins, a JSON list (e.g. '[\"*\"]'); no CORS headers when not given")
    g.add_argument("--allowed-methods", type=_json_list, default=None)
    g.add_argument("--allowed-headers", type=_json_list, default=None)
    g.add_argument("--allow-credentials", action="store_true")
    g.add_argument("--ssl-keyfile", default=None)
    g.add_argument("--ssl-certfile", default=None)


def apply_vllm_args(args: argparse.Namespace) -> None:
    """Fold the vLLM flags into v4serve's options; refuse what cannot run yet (ValueError with the reason)."""
    flag = getattr(args, "model_flag", None)
    if flag is not None:
        if args.model is not None and args.model != flag:
            raise ValueError(f"two models given: {args.model!r} (positional) and --model {flag!r}; give one")
        args.model = flag
    tp, dp = getattr(args, "tensor_parallel_size", 1), getattr(args, "data_parallel_size", 1)
    if tp < 1 or dp < 1:
        raise ValueError("--tensor-parallel-size and --data-parallel-size must be at least 1")
    if dp > 1 and not getattr(args, "enable_expert_parallel", False):
        raise ValueError(f"--data-parallel-size {dp}: data-parallel attention runs as DEP, with "
                         "--enable-expert-parallel (each data-parallel group of --tensor-parallel-size ranks its own "
                         "requests, attention and KV cache, the routed experts spread over all ranks); e.g. "
                         f"`-dp {dp} --enable-expert-parallel`, or tensor parallelism alone (-tp N)")
    if tp == 1 and dp == 1 and getattr(args, "enable_expert_parallel", False):
        log.info("--enable-expert-parallel: one rank holds every expert (a no-op at --tensor-parallel-size 1)")
    if getattr(args, "speculative_config", None):
        raise ValueError("--speculative-config: speculative decoding (MTP / DSpark drafts) is not available yet; "
                         "leave the flag out")
    mem = getattr(args, "kv_cache_memory_bytes", None)
    if mem is not None:
        if getattr(args, "kv_cache_memory", None) not in (None, mem):
            raise ValueError("--kv-cache-memory-bytes and --kv-cache-memory disagree; give one")
        args.kv_cache_memory = mem
    if getattr(args, "disable_uvicorn_access_log", False):
        args.access_log = False
    if getattr(args, "ssl_keyfile", None) and not getattr(args, "ssl_certfile", None) or \
            getattr(args, "ssl_certfile", None) and not getattr(args, "ssl_keyfile", None):
        raise ValueError("--ssl-keyfile and --ssl-certfile go together")
    for name, note in NOTED.items():
        if getattr(args, name, None):
            log.info("%s", note)
