"""Server processes of their own: API key, body limit, overload, SIGTERM, and an engine that dies."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

BASE = ["tiny-v4-flash", "--block-size", "64", "--max-model-len", "2048", "--kv-cache-memory", "128MiB",
        "--device", "cpu"]
LONG_STREAM = {"messages": [{"role": "user", "content": "Talk"}], "stream": True, "max_tokens": 1500,
               "ignore_eos": True}


def engine_pids(server_pid: int) -> list[int]:
    """Children of the server process that run the spawned engine."""
    pids = []
    for tid in os.listdir(f"/proc/{server_pid}/task"):
        for child in Path(f"/proc/{server_pid}/task/{tid}/children").read_text().split():
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            if b"spawn_main" in cmdline:
                pids.append(int(child))
    return pids


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "Z"  # a zombie has exited


def test_auth_limits_overload_and_sigterm(v4serve_process) -> None:
    server = v4serve_process(BASE + ["--api-key", "sekrit", "--max-num-seqs", "1", "--max-queue-len", "1",
                                     "--max-request-bytes", "64KiB", "--served-model-name", "demo", "coder"])
    key = {"Authorization": "Bearer sekrit"}
    with httpx.Client(base_url=server.url, timeout=30) as http:
        assert http.get("/health").status_code == 200
        r = http.get("/v1/models")
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert [m["id"] for m in http.get("/v1/models", headers=key).json()["data"]] == ["demo", "coder"]
        assert http.get("/metrics", headers={"x-api-key": "sekrit"}).status_code == 200
        r = http.post("/v1/chat/completions", headers=key,
                      json={"model": "coder", "messages": [{"role": "user", "content": "x" * 100_000}]})
        assert r.status_code == 413 and "--max-request-bytes" in r.json()["error"]["message"]
        # overload: 1 running + 1 queued is the limit
        with http.stream("POST", "/v1/chat/completions", headers=key, json=LONG_STREAM) as s1, \
                http.stream("POST", "/v1/chat/completions", headers=key, json=LONG_STREAM) as s2:
            assert s1.status_code == s2.status_code == 200
            r = http.post("/v1/chat/completions", headers=key,
                          json={"messages": [{"role": "user", "content": "one more"}], "max_tokens": 2})
            assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
            assert r.json()["error"]["type"] == "rate_limit_error"
        deadline = time.monotonic() + 20  # both streams were dropped: their slots come back
        while True:
            r = http.post("/v1/chat/completions", headers=key,
                          json={"messages": [{"role": "user", "content": "now?"}], "max_tokens": 2})
            if r.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert r.status_code == 200, r.text
    engines = engine_pids(server.proc.pid)
    assert len(engines) == 1
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(30) == 0, server.output()
    deadline = time.monotonic() + 10
    while not gone(engines[0]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert gone(engines[0]), "the engine process outlived the server"


def test_engine_death_fails_health_and_exits_nonzero(v4serve_process) -> None:
    server = v4serve_process(BASE)
    (engine,) = engine_pids(server.proc.pid)
    with httpx.Client(base_url=server.url, timeout=10) as http:
        with http.stream("POST", "/v1/chat/completions", json=LONG_STREAM) as s:
            assert s.status_code == 200
            os.kill(engine, signal.SIGKILL)
            tail = "".join(s.iter_text())  # the open stream ends, with an error event
        assert '"engine_dead"' in tail and tail.rstrip().endswith("data: [DONE]")
        deadline = time.monotonic() + 15
        saw_503 = False
        while server.proc.poll() is None and time.monotonic() < deadline:
            try:
                saw_503 |= http.get("/health").status_code == 503
            except httpx.TransportError:
                pass  # already shutting down
            time.sleep(0.05)
    try:
        code = server.proc.wait(15)
    except subprocess.TimeoutExpired:
        pytest.fail("the server kept running after its engine died:\n" + server.output())
    assert code == 1, server.output()
    assert "engine died" in server.output()
    del saw_503  # /health is 503 only in the short window before the exit; test_server_app checks the route


def test_demo_checkpoint_is_written_once(tmp_path: Path) -> None:
    from v4serve.server.launch import demo_checkpoint

    folder = demo_checkpoint(tmp_path)
    assert folder.name == "demo-tiny-v4-flash" and (folder / "config.json").is_file()
    assert [p.name for p in tmp_path.iterdir()] == [folder.name]  # written aside, then renamed: no leftovers
    stamp = (folder / "config.json").stat().st_mtime_ns
    assert demo_checkpoint(tmp_path) == folder
    assert (folder / "config.json").stat().st_mtime_ns == stamp
