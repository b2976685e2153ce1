"""Flags of `v4serve serve` that belong to the HTTP server (the engine's flags live in cli.add_engine_args)."""

from __future__ import annotations

import argparse
import os

from ..sizes import parse_bytes

API_KEY_ENV = "V4SERVE_API_KEY"
DEFAULT_MAX_REQUEST_BYTES = 32 << 20


def add_server_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 for all)")
    g.add_argument("--port", type=int, default=8000)
    g.add_argument("--api-key", action="append", default=None, metavar="KEY",
                   help=f"require `Authorization: Bearer KEY` (or `x-api-key: KEY`) on every route but /health; "
                        f"repeat for several keys (any one is accepted); default: ${API_KEY_ENV}")
    g.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                   help="model name(s) the API answers to; the first is reported in responses "
                        "(default: MODEL as given, or the demo preset's name)")
    g.add_argument("--max-request-bytes", type=parse_bytes, default=DEFAULT_MAX_REQUEST_BYTES,
                   help="request bodies above this size are refused with 413 before parsing (default 32MiB)")
    g.add_argument("--default-thinking", choices=["auto", "on", "off"], default="auto",
                   help="chat requests that do not say (chat_template_kwargs.thinking, reasoning_effort, "
                        "Anthropic `thinking`): auto = off for DeepSeek-V4, on for V4.1")
    g.add_argument("--control-tokens-in-content", action="store_true",
                   help="tokenize control-token strings inside chat message content (e.g. `<｜Assistant｜>`, "
                        "`</think>`) as control tokens, as v4serve did before; by default they are plain text, so "
                        "untrusted content cannot forge turns")
    g.add_argument("--retry-after", type=int, default=1,
                   help="seconds in the Retry-After header of 429 answers (queue beyond --max-queue-len)")
    g.add_argument("--engine-ready-timeout", type=float,
                   default=float(os.environ.get("V4SERVE_ENGINE_READY_TIMEOUT_S", "1800")),
                   help="seconds to wait for the engine to load the model")
    g.add_argument("--graceful-shutdown-timeout", type=float, default=10.0,
                   help="on SIGINT/SIGTERM, seconds open requests get to finish before they are cancelled")
    g.add_argument("--uvicorn-log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug", "trace"])
    g.add_argument("--no-access-log", dest="access_log", action="store_false", help="no per-request log lines")
