"""Kernels compiled for sm_90 on a machine without a GPU: Triton's bundled ptxas in a fresh process (outside the
interpreter that the test session runs under), for tests that read the generated TTGIR / PTX."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def run_compile(code: str) -> str:
    """Run `code` (which compiles with triton.compile for GPUTarget("cuda", 90, 32) and prints what it read) in a
    fresh interpreter-free process -> its stdout. Skips the test where this Triton build has no ptxas."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                         check=False)
    if run.returncode != 0:
        if "ptxas" in run.stderr and "not found" in run.stderr.lower():
            pytest.skip("this Triton build has no ptxas")
        raise AssertionError(run.stderr[-2000:])
    return run.stdout
