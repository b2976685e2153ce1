"""Server flags (the server issue owns this file; kept minimal until then)."""

from __future__ import annotations

import argparse


def add_server_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
