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


# A prelude for run_compile's code: `compile_launches(call)` runs `call()` (a launcher of our kernels on CPU tensors)
# with every @jit kernel of v4serve.ops.kernels replaced by a recorder of its launches, then compiles each recorded
# launch for sm_90 with the signature the JIT would give those arguments (tensors -> pointers of their dtype, ints,
# floats, None -> a constexpr None, the kernel's defaults for omitted constexprs; PDL on, as on the GPU) -> the
# compiled kernels. It reaches what a hand-written signature misses: the arguments the launcher really passes.
RECORD_AND_COMPILE = r'''
import importlib, pkgutil, torch, triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import CUDAOptions
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction
import v4serve.ops.kernels as _pkg

_PTR = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp64",
        torch.int8: "i8", torch.uint8: "u8", torch.int16: "i16", torch.int32: "i32", torch.int64: "i64",
        torch.float8_e4m3fn: "fp8e4nv", torch.bool: "i1"}


def _type(v):
    if isinstance(v, torch.Tensor):
        return "*" + _PTR[v.dtype]
    if isinstance(v, bool):
        return "i1"
    if isinstance(v, int):
        return "i32" if -2**31 <= v < 2**31 else "i64"
    if isinstance(v, float):
        return "fp32"
    raise TypeError(f"no Triton type for {type(v)}")


class _Recorder:
    def __init__(self, fn, launches):
        self.fn, self.launches = fn, launches

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((self.fn, args, kwargs))


def compile_launches(call):
    launches, saved = [], []
    for m in pkgutil.iter_modules(_pkg.__path__):
        mod = importlib.import_module(f"{_pkg.__name__}.{m.name}")
        for name, obj in list(vars(mod).items()):
            if isinstance(obj, JITFunction):
                saved.append((mod, name, obj))
                setattr(mod, name, _Recorder(obj, launches))
    try:
        call()
    finally:
        for mod, name, obj in saved:
            setattr(mod, name, obj)
    fields = set(CUDAOptions.__dataclass_fields__)
    out = []
    for fn, args, kwargs in launches:
        kwargs = {**kwargs, "PDL": True} if "PDL" in fn.arg_names else dict(kwargs)
        sig, const = {}, {}
        for i, p in enumerate(fn.params):
            given = i < len(args) or p.name in kwargs
            v = args[i] if i < len(args) else kwargs[p.name] if given else p.default
            if p.is_constexpr or v is None:
                sig[p.name], const[p.name] = "constexpr", v
            else:
                sig[p.name] = _type(v)
        opts = {k: v for k, v in kwargs.items() if k in fields}
        out.append((fn.__name__, triton.compile(ASTSource(fn, sig, const), target=GPUTarget("cuda", 90, 32),
                                                 options=opts)))
    return out
'''
