"""Environment switches read on every kernel launch, at dict speed.

`os.environ.get` costs about 1 us (key encoding and the Mapping protocol); an eager V4 step read switches ~4,700 times
(the interpreter check, PDL, fusions: H200 host profile, eighteenth session, ~5% of the step's host time). `get` reads
CPython's dict behind `os.environ` with the key encoded once, so a change made through `os.environ` (a test's
`monkeypatch.setenv` included) is seen at once, as with `os.environ.get`; where that dict is absent it is
`os.environ.get`.
"""

from __future__ import annotations

import os

_DATA = getattr(os.environ, "_data", None)
_ENCODE = getattr(os.environ, "encodekey", None)
_DECODE = getattr(os.environ, "decodevalue", None)
_KEYS: dict[str, object] = {}


def get(name: str, default: str | None = None) -> str | None:
    if _DATA is None or _ENCODE is None or _DECODE is None:
        return os.environ.get(name, default)
    key = _KEYS.get(name)
    if key is None:
        key = _KEYS[name] = _ENCODE(name)
    value = _DATA.get(key)
    return default if value is None else _DECODE(value)


def switch(name: str, default: bool) -> bool:
    """An on/off switch that may also be left unset: "1" on, "0" off, anything else the caller's default (which may
    depend on the case, e.g. on a weight's block size)."""
    value = get(name)
    return value == "1" if value in ("0", "1") else default


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (TRITON_INTERPRET set and not 0: the tests)."""
    return get("TRITON_INTERPRET", "0") not in ("", "0")
