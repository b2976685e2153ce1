"""ops/kernels.step_jit: every launched kernel compiles its step-dependent integers (token, row, group, pick, column
and block counts, the block table's width: STEP_ARGS) as plain integers by default (V4SERVE_STEP_SPECIALIZE=0), and as
Triton specialises them under V4SERVE_STEP_SPECIALIZE=1. Checked outside the interpreter (a fresh process: the
compiled JITFunctions' parameters)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = """
import importlib, json, pkgutil
import triton
from triton.runtime.jit import JITFunction
import v4serve.ops.kernels as K
out = {}
for m in pkgutil.iter_modules(K.__path__):
    mod = importlib.import_module(f"v4serve.ops.kernels.{m.name}")
    for name, obj in vars(mod).items():
        if isinstance(obj, JITFunction) and name.endswith("kernel") and obj.__module__ == mod.__name__:
            out[f"{m.name}.{name}"] = {"params": [p.name for p in obj.params if not p.is_constexpr],
                                       "unspecialised": [p.name for p in obj.params
                                                         if p.do_not_specialize and not p.is_constexpr],
                                       "constexpr_unspecialised": [p.name for p in obj.params
                                                                   if p.do_not_specialize and p.is_constexpr]}
print(json.dumps({"kernels": out, "step_args": list(K.STEP_ARGS)}))
"""


def _probe(specialize: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "V4SERVE_STEP_SPECIALIZE")}
    if specialize is not None:
        env["V4SERVE_STEP_SPECIALIZE"] = specialize
    run = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300,
                         check=False)
    if run.returncode != 0:
        pytest.fail(run.stderr[-2000:])
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_step_arguments_are_plain_integers_when_asked() -> None:
    got = _probe("0")
    kernels, step = got["kernels"], set(got["step_args"])
    assert len(kernels) >= 24  # every launched kernel of ops/kernels/
    with_step_args = 0
    for name, k in kernels.items():
        want = [p for p in k["params"] if p in step]
        assert k["unspecialised"] == want, name  # step_jit, not a plain triton.jit
        # the GPU compiler rejects a constexpr listed in do_not_specialize (the compressor's M, the prologue's G:
        # sixteenth session); the interpreter never checks
        assert k["constexpr_unspecialised"] == [], name
        with_step_args += bool(want)
    assert with_step_args >= 18  # those that saw several classes of these in a mixed CPU workload, and more
    assert kernels["mhc._hc_pre_kernel"]["unspecialised"] == ["T"]


def test_triton_specialises_them_when_asked() -> None:
    assert all(not k["unspecialised"] for k in _probe("1")["kernels"].values())


def test_unspecialised_by_default() -> None:
    assert _probe(None) == _probe("0")
