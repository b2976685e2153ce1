"""Layouts a machine cannot run fail before any process starts, with a message saying what to change; a worker rank
that dies is noticed at once (the rank watch), not at the next collective: /health fails without any request."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from v4serve.dist.workers import check_devices

from .common import healthy
from .test_serve_dp import _worker_pid


def test_more_ranks_than_gpus_is_refused() -> None:
    with pytest.raises(ValueError, match="4 ranks on this machine need 4 GPUs .* it has 2"):
        check_devices(torch.device("cuda"), 4, available=2)
    with pytest.raises(ValueError, match="rank 0 on cuda:0"):
        check_devices(torch.device("cuda", 1), 2, available=8)
    check_devices(torch.device("cuda", 0), 8, available=8)
    check_devices(torch.device("cpu"), 64)  # CPU ranks share the machine's cores


def test_the_cli_refuses_a_layout_without_its_gpus(capsys: pytest.CaptureFixture) -> None:
    from v4serve.cli import main

    n = torch.cuda.device_count() + 2  # ranks on one machine: two more than it has GPUs
    assert main(["serve", "tiny-v4-flash", "-tp", str(n), "--device", "cuda"]) == 2
    assert f"{n} ranks on this machine need {n} GPUs" in capsys.readouterr().err
    assert main(["serve", "tiny-v4-flash", "-dp", str(2 * n), "--enable-expert-parallel", "--nnodes", "2",
                 "--master-addr", "h", "--master-port", "1", "--device", "cuda"]) == 2
    assert f"{n} ranks on this machine need {n} GPUs" in capsys.readouterr().err


def test_a_dead_worker_stops_the_server_without_a_request(v4serve_process, tp_folder: str) -> None:
    """No request runs, so no collective would notice: the rank watch does, the engine reports it and exits, and the
    server stops serving (/health fails: 503 while it shuts down, then no answer) with the reason in its log."""
    args = [tp_folder, "--served-model-name", "tp", "--block-size", "64", "--max-model-len", "1024",
            "--kv-cache-memory", "64MiB", "--device", "cpu", "--kernels", "reference", "-tp", "2"]
    server = v4serve_process(args)
    try:
        assert healthy(server.url)
        worker = _worker_pid(server.output())
        os.kill(worker, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while healthy(server.url) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not healthy(server.url)
        assert server.proc.wait(timeout=60) == 1
        assert f"rank 1 (process {worker}) exited with code -9" in server.output()
    finally:
        server.stop()


pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")
