"""engine/compile_watch.py records Triton's compiles by kernel name, with what made each new variant new, chained to a
hook set before it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from v4serve.engine import compile_watch


def _compile(bm: int, rows_aligned: bool, warps: int = 4) -> dict:
    """The `compile` argument of triton 3.6's jit_post_compile_hook (JITFunction._pack_args): a kernel of x, rows, M
    and the constexpr BM; rows 16-byte aligned or not."""
    return {"key": None, "signature": {"x": "*bf16", "rows": "*i64", "M": "i32", "BM": "constexpr"},
            "constants": {(3,): bm}, "configs": [{(0,): [["tt.divisibility", 16]],
                                                  **({(1,): [["tt.divisibility", 16]]} if rows_aligned else {})}],
            "num_warps": warps, "num_stages": 3}


def test_compiles_are_recorded_and_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    knobs = pytest.importorskip("triton").knobs
    seen = []
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", lambda **kw: seen.append(kw["fn"].name))
    monkeypatch.setattr(compile_watch, "_installed", False)
    monkeypatch.setattr(compile_watch, "_variants", {})
    assert compile_watch.install() and compile_watch.install()  # a second call changes nothing
    compile_watch.take()
    hook = knobs.runtime.jit_post_compile_hook
    for name, comp in (("_attend_kernel", _compile(2, True)), ("_gate_up_kernel", {}),
                       ("_attend_kernel", _compile(4, False)), ("_attend_kernel", _compile(2, True, warps=8))):
        hook(fn=SimpleNamespace(name=name), key=None, repr="", compile=comp, is_manual_warmup=False,
             already_compiled=False)
    got = compile_watch.take()
    assert [c.name for c in got] == ["_attend_kernel", "_gate_up_kernel", "_attend_kernel", "_attend_kernel"]
    assert got[0].new == "" and got[1].new == ""  # first variants; a hook argument of another form
    # the new variant against the nearest earlier one: the constexpr's value and the pointer's lost alignment
    assert got[2].new == "rows: *i64 tt.divisibility=16 -> *i64; BM: =2 -> =4"
    assert got[3].new == "num_warps: 4 -> 8"  # nearest: the first variant, which differs only in its warps
    assert compile_watch.take() == []
    assert seen == ["_attend_kernel", "_gate_up_kernel", "_attend_kernel", "_attend_kernel"]  # the earlier hook runs


def test_description_of_other_forms_is_none() -> None:
    assert compile_watch.describe({}) is None and compile_watch.describe({"signature": None}) is None
    assert compile_watch.difference(None, [{"a": "1"}]) == "" and compile_watch.difference({"a": "1"}, []) == ""
