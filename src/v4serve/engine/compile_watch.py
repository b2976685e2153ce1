"""Which Triton kernels compiled while the engine served (engine/core.py names them in a warning).

A kernel compiles on its first launch for each specialisation; while serving, that stops every running request for
the compile's seconds. `--warmup` (engine/warmup.py) compiles the common shapes before the server reports ready; a
compile after it is a shape the warm-up missed, worth knowing by name and by what made it new (which constexpr or
argument class differs from the variants compiled before). Triton calls `jit_post_compile_hook` after each compile
in this process (a hit in its on-disk cache included).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Compiled:
    """One compile: the kernel, and what its new variant has that the nearest earlier variant of that kernel in this
    process did not ("param: old -> new; ...": a constexpr's value, an argument's type or its divisibility / alignment
    class, the warps or stages; "" for a kernel's first variant or where Triton's hook gave no signature)."""

    name: str
    new: str = ""


_compiles: list[Compiled] = []
_variants: dict[str, list[dict[str, str]]] = {}  # kernel -> each compiled variant's description
_lock = threading.Lock()
_installed = False


def describe(compile: dict[str, Any]) -> dict[str, str] | None:
    """A compile's specialisation, parameter by parameter, from the `compile` argument of Triton's
    jit_post_compile_hook (triton 3.6: `signature` {name: type}, `constants` {(index, ...): value} for constexprs,
    `configs[0]` {(index, ...): [[attribute, value], ...]} for divisibility and alignment), plus the launch options.
    None where it has another form."""
    try:
        sig = compile["signature"]
        names = list(sig)
        out = {n: str(t) for n, t in sig.items()}
        for path, value in (compile.get("constants") or {}).items():
            out[names[path[0]]] = f"={value}"
        for path, attrs in ((compile.get("configs") or [{}])[0] or {}).items():
            out[names[path[0]]] += " " + ",".join(f"{a}={v}" for a, v in attrs)
        for option in ("num_warps", "num_stages"):
            if option in compile:
                out[option] = str(compile[option])
        return out
    except (KeyError, TypeError, IndexError, ValueError, AttributeError):
        return None


def difference(new: dict[str, str] | None, earlier: list[dict[str, str]]) -> str:
    """What `new` has that the earlier variant closest to it lacks ("" without either)."""
    if new is None or not earlier:
        return ""
    nearest = min(earlier, key=lambda e: sum(e.get(k) != v for k, v in new.items()))
    return "; ".join(f"{k}: {nearest.get(k, '-')} -> {v}" for k, v in new.items() if nearest.get(k) != v)


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
        name = getattr(info, "name", None) or str(info)
        desc = describe(kw.get("compile") or {})
        with _lock:
            seen = _variants.setdefault(name, [])
            _compiles.append(Compiled(name, difference(desc, seen)))
            if desc is not None:
                seen.append(desc)
        return previous(**kw) if previous is not None else None

    knobs.runtime.jit_post_compile_hook = hook
    _installed = True
    return True


def take() -> list[Compiled]:
    """The compiles since the last call (in order). Called every engine step: nothing to take is the usual case,
    answered without the lock."""
    if not _compiles:
        return []
    with _lock:
        out = list(_compiles)
        _compiles.clear()
    return out
