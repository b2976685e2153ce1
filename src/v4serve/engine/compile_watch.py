"""Which Triton kernels compiled while the engine served (engine/core.py names them in a warning).

A kernel compiles on its first launch for each specialisation; while serving, that stops every running request for
the compile's seconds. `--warmup` (engine/warmup.py) compiles the common shapes before the server reports ready; a
compile after it is a shape the warm-up missed, worth knowing by name. Triton calls `jit_post_compile_hook` after each
compile in this process (a hit in its on-disk cache included).
"""

from __future__ import annotations

import threading
from typing import Any

_names: list[str] = []
_lock = threading.Lock()
_installed = False


def install() -> bool:
    """Record every compile from now on (chained to a hook already set). False where Triton is not there."""
    global _installed
    if _installed:
        return True
    try:
        from triton import knobs
    except ImportError:
        return False
    previous = knobs.runtime.jit_post_compile_hook

    def hook(**kw: Any) -> Any:
        info = kw.get("fn")
        with _lock:
            _names.append(getattr(info, "name", None) or str(info))
        return previous(**kw) if previous is not None else None

    knobs.runtime.jit_post_compile_hook = hook
    _installed = True
    return True


def take() -> list[str]:
    """The kernels compiled since the last call (in order; one entry a compile). Called every engine step: nothing
    to take is the usual case, answered without the lock."""
    if not _names:
        return []
    with _lock:
        out = list(_names)
        _names.clear()
    return out
