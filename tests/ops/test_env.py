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
