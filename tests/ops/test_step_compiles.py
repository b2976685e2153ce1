"""Every kernel a tiny V4 step launches compiles for sm_90, with the arguments the step really passes and the step
integers as the GPU compiles them (ops/kernels.step_jit). Triton's interpreter, which runs the kernels in CI, never
type-checks a kernel as the GPU compiler does: twice a kernel that passed every CPU test failed to compile on the
H200 (the mHC expansion, sixteenth session; constexprs listed in do_not_specialize, seventeenth). Two fresh processes:
one serves a short request under the interpreter and records each launch's arguments (tensors by dtype), the other
compiles up to two launches of each kernel (distinct constexprs) with Triton's bundled ptxas, no GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

RECORD = r'''
import json, sys, torch
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction
seen, out = set(), []
_run = InterpretedFunction.run
def run(self, *args, grid, warmup, **kwargs):
    rec = []
    for i, n in enumerate(self.arg_names):
        v = args[i] if i < len(args) else kwargs.get(n, "<default>")
        if isinstance(v, torch.Tensor):
            rec.append([n, "T", str(v.dtype)])
        elif isinstance(v, tl.dtype):
            rec.append([n, "D", v.name])
        elif v is None or isinstance(v, (bool, int, float, str)):
            rec.append([n, "V", v])
        else:
            raise TypeError(f"{self.fn.__name__}: no record for {n}={v!r}")
    rec += [[n, "V", v] for n, v in kwargs.items() if n not in self.arg_names]
    key = repr([self.fn.__module__, self.fn.__name__, rec])
    if key not in seen:
        seen.add(key)
        out.append([self.fn.__module__, self.fn.__name__, rec])
    return _run(self, *args, grid=grid, warmup=warmup, **kwargs)
InterpretedFunction.run = run
from v4serve import LLM, SamplingParams
llm = LLM("tiny-v4-flash", dtype="bfloat16", kernels="triton", block_size=64, max_model_len=256,
          kv_cache_memory=32 << 20)
llm.generate([list(range(100, 133)), list(range(200, 207))], SamplingParams(max_tokens=2, temperature=0))
print(json.dumps(out))
'''

COMPILE = r'''
import importlib, json, sys, triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
PTR = {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32", "torch.float64": "fp64",
       "torch.int8": "i8", "torch.uint8": "u8", "torch.int16": "i16", "torch.int32": "i32", "torch.int64": "i64",
       "torch.float8_e4m3fn": "fp8e4nv", "torch.bool": "i1"}
GPU_FLAGS = {"PDL": True, "INTERPRET": False, "HAND_RNE": False}  # what the same launch passes on a GPU
launches = json.load(sys.stdin)
per_kernel, done = {}, []
for mod, name, rec in launches:
    fn = getattr(importlib.import_module(mod), name)
    values = {n: v for n, _, v in rec}
    const_key = repr([(p.name, values.get(p.name)) for p in fn.params if p.is_constexpr])
    keys = per_kernel.setdefault(name, [])
    if const_key in keys or len(keys) >= 2:
        continue
    keys.append(const_key)
    sig, const, opts = {}, {}, {}
    for (n, kind, v), p in zip(rec, fn.params):
        v = p.default if v == "<default>" else tl.dtype(v) if kind == "D" else GPU_FLAGS.get(n, v)
        if p.is_constexpr or v is None:
            sig[n], const[n] = "constexpr", v
        elif kind == "T":
            sig[n] = "*" + PTR[v]
        elif isinstance(v, bool):
            sig[n] = "i1"
        elif isinstance(v, int):
            sig[n] = "i32" if -2**31 <= v < 2**31 else "i64"
        else:
            sig[n] = "fp32"
    opts = {n: v for n, _, v in rec[len(fn.params):] if n in ("num_warps", "num_stages")}
    try:
        triton.compile(ASTSource(fn, sig, const), target=GPUTarget("cuda", 90, 32), options=opts)
        done.append(name)
    except Exception as e:
        print(json.dumps({"failed": name, "error": str(e)[-1500:]}))
        sys.exit(1)
print(json.dumps({"compiled": done}))
'''


def _python(code: str, interpret: bool, stdin: str | None = None, cache: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    if cache:  # an empty compile cache: a cached kernel would skip the code generator's checks
        env["TRITON_CACHE_DIR"] = cache
    run = subprocess.run([sys.executable, "-c", code], env=env, input=stdin, capture_output=True, text=True,
                         timeout=900, check=False)
    if run.returncode != 0:
        if "ptxas" in run.stderr and "not found" in run.stderr.lower():
            pytest.skip("this Triton build has no ptxas")
        raise AssertionError((run.stdout[-2000:], run.stderr[-2000:]))
    return run.stdout.strip().splitlines()[-1]


def test_every_kernel_of_a_step_compiles_for_sm90(tmp_path) -> None:
    launches = _python(RECORD, interpret=True)
    got = json.loads(_python(COMPILE, interpret=False, stdin=launches, cache=str(tmp_path)))
    # the step's families: addressing, mHC, GEMM / GEMV, norm, finish, attention, router, MoE,
    # compressor, indexer
    want = {"_window_kernel", "_compression_kernel", "_hc_pre_kernel", "_finish_kernel",
            "_attend_kernel", "_router_kernel", "_prologue_kernel", "_gate_up_kernel", "_down_kernel", "_pool_kernel",
            "_logits_kernel", "_select_kernel", "_decode_gemm_kernel"}
    assert want <= set(got["compiled"]), sorted(want - set(got["compiled"]))
