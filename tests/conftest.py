"""Test-wide setup.

TRITON_INTERPRET must be set before any Triton kernel module is imported. Torch runs single-threaded: the
suite starts engine subprocesses next to the test process, and OpenMP threads spinning on 2 shared cores slow
small ops by orders of magnitude.
"""

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import pytest

if not os.environ.get("V4SERVE_TEST_DEVICE", "").startswith("cuda"):
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(1)


# ------------------------------------------------------------------------------------------------------------
# A real `v4serve serve` process on a free loopback port (tests/server/test_server_*.py, the benchmark E2E test)
# ------------------------------------------------------------------------------------------------------------
TINY_SERVER_ARGS = ["tiny-v4-flash", "--block-size", "64", "--max-model-len", "4096", "--kv-cache-memory", "256MiB",
                    "--device", "cpu"]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class V4ServeProcess:
    """One `python -m v4serve.cli serve ...` subprocess; `url` once /health answers."""

    def __init__(self, args: list[str], ready_timeout: float = 180.0, launcher: list[str] | None = None) -> None:
        """launcher: python arguments that run `-m v4serve.cli` under a launcher (e.g. torch.distributed.run)."""
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        fd, self.log_path = tempfile.mkstemp(prefix="v4serve-test-", suffix=".log")
        env = {**os.environ, "OMP_NUM_THREADS": "1", "V4SERVE_CPU_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
        env.pop("V4SERVE_API_KEY", None)
        cmd = [sys.executable, *(launcher or []), "-m", "v4serve.cli", "serve", *args, "--port", str(self.port),
               "--uvicorn-log-level", "warning"]
        try:
            self.proc = subprocess.Popen(cmd, stdout=fd, stderr=subprocess.STDOUT, env=env)
        finally:
            os.close(fd)
        deadline = time.monotonic() + ready_timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"v4serve serve exited with {self.proc.returncode}:\n{self.output()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                log = self.output()
                self.stop()
                raise RuntimeError(f"v4serve serve not healthy after {ready_timeout:.0f} s:\n{log}")
            time.sleep(0.25)

    def output(self) -> str:
        """The last lines of the server's log (stdout and stderr)."""
        if not os.path.exists(self.log_path):
            return "(log removed)"
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()[-6000:]

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if os.path.exists(self.log_path):
            os.unlink(self.log_path)
        return self.proc.returncode


@pytest.fixture(scope="session")
def tiny_server_url():
    """URL of a shared `v4serve serve tiny-v4-flash` (block size 64, context 4096) on a free port."""
    server = V4ServeProcess(TINY_SERVER_ARGS)
    yield server.url
    server.stop()


@pytest.fixture(scope="session")
def v4serve_process():
    """Factory for servers with their own flags: `v4serve_process([...args])` -> V4ServeProcess (stopped at the
    end of the session if the test did not stop it)."""
    started: list[V4ServeProcess] = []

    def start(args: list[str], launcher: list[str] | None = None) -> V4ServeProcess:
        server = V4ServeProcess(args, launcher=launcher)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
