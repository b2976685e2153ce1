"""Programmatic dependent launch (ops/kernels/pdl.py): every Triton kernel waits for its predecessor before it touches
global memory, and every launch site asks for PDL.

A kernel launched with PDL may start while the kernel before it still runs; it is correct only if nothing before
`griddepcontrol.wait` reads or writes global memory. The first test checks the source of every kernel module (the
wait is the first statement of each kernel, every launch passes `pdl_launch`); the second compiles a kernel for sm_90
with Triton's bundled ptxas (no GPU needed) and checks the order in the PTX itself.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch
from sm90_compile import run_compile

from v4serve.ops.kernels import pdl

KERNELS = Path(__file__).resolve().parents[2] / "src" / "v4serve" / "ops" / "kernels"
# (split_grid.py and attention_rows.py hold device functions that kernels call, and launch nothing)
MODULES = sorted(p for p in KERNELS.glob("*.py")
                 if p.name not in ("__init__.py", "pdl.py", "split_grid.py", "attention_rows.py"))


def _jit_kernels(tree: ast.Module) -> list[ast.FunctionDef]:
    """The @triton.jit / @step_jit functions that take a PDL parameter (the kernels; helpers take none)."""
    out = []
    for node in tree.body:
        if (isinstance(node, ast.FunctionDef)
                and any(ast.unparse(d) in ("triton.jit", "step_jit") for d in node.decorator_list)
                and any(a.arg == "PDL" for a in node.args.args)):
            out.append(node)
    return out


SAFE_BEFORE_WAIT = {"tl.program_id", "tl.num_programs", "tl.arange", "tl.minimum", "tl.maximum", "tl.where",
                    "tl.cdiv", "prefetch_rows"}


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_every_kernel_waits_first_and_every_launch_asks_for_pdl(path: Path) -> None:
    src = path.read_text()
    tree = ast.parse(src)
    kernels = _jit_kernels(tree)
    for fn in kernels:
        body = [st for st in fn.body if not (isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant))]
        enter = [i for i, st in enumerate(body) if ast.unparse(st) in ("pdl_enter(PDL)", "pdl_enter(PDL, EARLY)")]
        assert enter, f"{path.name}:{fn.name} never waits"
        # before the wait: index arithmetic only (and the GEMV's L2 prefetch of its weights, which no kernel writes)
        for st in body[:enter[0]]:
            for call in (n for n in ast.walk(st) if isinstance(n, ast.Call)):
                assert ast.unparse(call.func) in SAFE_BEFORE_WAIT, (
                    f"{path.name}:{fn.name} calls {ast.unparse(call.func)} before the wait")
    # launch sites: every kernel[grid](...) call of the module (moe.py picks its GEMM kernels into local names)
    launches = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript)
                and isinstance(node.func.value, ast.Name) and node.func.value.id.endswith("kernel")]
    for call in launches:
        kw = [ast.unparse(k.value) for k in call.keywords if k.arg is None]
        assert any(k.startswith("pdl_launch(") for k in kw), f"{path.name}: {call.func.value.id} launched without PDL"
    # moe_decode's kernels launch from moe.py; scaled_mm.py is a cuBLAS call (no Triton kernel: a launch after it
    # waits for it in full, as after any torch op)
    assert bool(launches) == (path.name not in ("moe_decode.py", "scaled_mm.py")), path.name
    assert bool(kernels) == (path.name != "scaled_mm.py"), path.name  # every module of kernels has its kernels checked


def test_launch_arguments_off_the_gpu() -> None:
    """Under the interpreter (and on the CPU) kernels compile without the wait and launch without the attribute."""
    assert pdl.launch(torch.zeros(1)) == {"PDL": False}
    assert not pdl.prefetch(torch.zeros(1))


COMPILE = """
import re, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from v4serve.ops.kernels import fp8_gemv
fn = fp8_gemv._decode_gemm_kernel
ptrs = {"x_ptr": "*bf16", "xs_ptr": "*fp32", "w_ptr": "*fp8e4nv", "ws_ptr": "*u8", "part_ptr": "*fp32",
        "y_ptr": "*bf16", "ys_ptr": "*fp32", "cnt_ptr": "*i32"}
const = dict(SB=128, A_FP8=True, A_PRE=False, BM=16, BN=64, BK=128, SPLITS=4, INTERPRET=False, PDL=True,
             PREFETCH=False, SWAP=True, W_SCALED=True, QG=0, OUT_DT=triton.language.bfloat16, FMA=False, EVEN_K=False,
             FMA_STAGES=1, DEQ=False, FULL=False, PAIR=False)
sig = {n: ptrs.get(n, "constexpr" if n in const else "i32") for n in fn.arg_names}
k = triton.compile(ASTSource(fn, sig, const), target=GPUTarget("cuda", 90, 32),
                   options={"num_warps": 4, "num_stages": 4, "launch_pdl": True})
print(k.asm["ptx"])
"""


def test_the_wait_precedes_every_global_access_in_the_ptx() -> None:
    """Compiled for sm_90 by Triton's bundled ptxas (no GPU needed; a fresh process, outside the interpreter): in the
    decode GEMV with PDL, no global load, store or atomic comes before `griddepcontrol.wait`, and `launch_dependents`
    follows it."""
    ptx = run_compile(COMPILE)
    body = ptx[ptx.index("{", ptx.index(".entry")):]
    wait = body.index("griddepcontrol.wait")
    first_global = re.search(r"\b(ld\.global|st\.global|atom\.global|red\.global|cp\.async\.(?!bulk\.prefetch))", body)
    assert first_global is not None and wait < first_global.start()
    assert wait < body.index("griddepcontrol.launch_dependents")


COMPILE_EARLY = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from v4serve.ops.kernels import moe
fn = moe._prologue_kernel
ptrs = {"ids_ptr": "*i64", "x_ptr": "*bf16", "xq_ptr": "*bf16"}
const = dict(BM=16, E_PAD=16, CHUNK=16, QUANT_X=True, G=32, BR=16, BC=128, PDL=True, xs_ptr=None, X8=False,
             BLOCKS=True, EARLY=EARLY)
sig = {n: "constexpr" if n in const else ptrs.get(n, "*i32" if n.endswith("_ptr") else "i32") for n in fn.arg_names}
k = triton.compile(ASTSource(fn, sig, const), target=GPUTarget("cuda", 90, 32),
                   options={"num_warps": 4, "launch_pdl": True})
print(k.asm["ptx"])
"""


@pytest.mark.parametrize("early", [False, True])
def test_early_launch_lets_the_successor_go_before_the_wait(early: bool, monkeypatch) -> None:
    """The MoE sort launch with EARLY (V4SERVE_PDL_EARLY=moe_prologue): `launch_dependents` before the wait, and still
    no global access before it; without, after."""
    ptx = run_compile(COMPILE_EARLY.replace("EARLY=EARLY", f"EARLY={early}"))
    body = ptx[ptx.index("{", ptx.index(".entry")):]
    wait, go = body.index("griddepcontrol.wait"), body.index("griddepcontrol.launch_dependents")
    first_global = re.search(r"\b(ld\.global|st\.global|atom\.global|red\.global|cp\.async)", body)
    assert first_global is not None and wait < first_global.start()
    assert (go < wait) == early
    monkeypatch.setenv(pdl.EARLY_ENV, "moe_prologue,other")
    assert pdl.early("moe_prologue") and not pdl.early("moe")
    monkeypatch.delenv(pdl.EARLY_ENV)
    assert not pdl.early("moe_prologue")
