"""ops/env.get: the environment switches read on every launch, as `os.environ.get` reads them, changes included."""

import os

import pytest

from v4serve.ops import env


def test_reads_as_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("V4SERVE_TEST_SWITCH", raising=False)
    assert env.get("V4SERVE_TEST_SWITCH") is None and env.get("V4SERVE_TEST_SWITCH", "1") == "1"
    monkeypatch.setenv("V4SERVE_TEST_SWITCH", "naïve,0")
    assert env.get("V4SERVE_TEST_SWITCH") == os.environ.get("V4SERVE_TEST_SWITCH") == "naïve,0"
    os.environ["V4SERVE_TEST_SWITCH"] = ""
    assert env.get("V4SERVE_TEST_SWITCH", "x") == ""
    del os.environ["V4SERVE_TEST_SWITCH"]
    assert env.get("V4SERVE_TEST_SWITCH", "d") == "d"
    for name in ("PATH", "HOME", "TRITON_INTERPRET"):
        assert env.get(name) == os.environ.get(name)


def test_interpreting_follows_triton_interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one interpreter check (ops/env.py), as backend and the kernels read it."""
    from v4serve.ops import backend, kernels

    assert kernels.interpreting is env.interpreting
    for value, on in (("1", True), ("0", False), ("", False)):
        monkeypatch.setenv("TRITON_INTERPRET", value)
        assert env.interpreting() is on
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        backend.resolve("triton", "cpu")  # no CUDA and no interpreter: refused


def test_switch_forces_either_way_or_keeps_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """A switch left unset (or set to anything but 0 / 1) gives the caller's default; 1 and 0 force it."""
    monkeypatch.delenv("V4SERVE_TEST_SWITCH", raising=False)
    assert env.switch("V4SERVE_TEST_SWITCH", True) and not env.switch("V4SERVE_TEST_SWITCH", False)
    monkeypatch.setenv("V4SERVE_TEST_SWITCH", "1")
    assert env.switch("V4SERVE_TEST_SWITCH", False)
    monkeypatch.setenv("V4SERVE_TEST_SWITCH", "0")
    assert not env.switch("V4SERVE_TEST_SWITCH", True)
    monkeypatch.setenv("V4SERVE_TEST_SWITCH", "yes")
    assert env.switch("V4SERVE_TEST_SWITCH", True) and not env.switch("V4SERVE_TEST_SWITCH", False)
