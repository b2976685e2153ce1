"""engine/compile_watch.py records Triton's compiles by kernel name, chained to a hook set before it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from v4serve.engine import compile_watch


def test_compiles_are_recorded_and_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    knobs = pytest.importorskip("triton").knobs
    seen = []
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", lambda **kw: seen.append(kw["fn"].name))
    monkeypatch.setattr(compile_watch, "_installed", False)
    assert compile_watch.install() and compile_watch.install()  # a second call changes nothing
    compile_watch.take()
    hook = knobs.runtime.jit_post_compile_hook
    for name in ("_attend_kernel", "_gate_up_kernel", "_attend_kernel"):
        hook(fn=SimpleNamespace(name=name), key=None, repr="", compile={}, is_manual_warmup=False,
             already_compiled=False)
    assert compile_watch.take() == ["_attend_kernel", "_gate_up_kernel", "_attend_kernel"]
    assert compile_watch.take() == []
    assert seen == ["_attend_kernel", "_gate_up_kernel", "_attend_kernel"]  # the earlier hook still runs
