"""`torchrun --nproc-per-node 2 -m v4serve.cli serve MODEL -tp 2`: torchrun starts both ranks (rank 0 serves HTTP and
runs the engine, which spawns no worker of its own; rank 1 runs the worker loop) and they meet at torchrun's
MASTER_ADDR / MASTER_PORT over gloo; the answer equals a single-process server's. The launcher's environment is read
by dist/launcher.py."""

from __future__ import annotations

import pytest

from v4serve.dist.launcher import from_environment

from .common import free_port
from .test_serve_tp import _ask

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")


def test_torchrun_launches_the_ranks(v4serve_process, tp_folder: str) -> None:
    base = [tp_folder, "--served-model-name", "tp", "--block-size", "64", "--max-model-len", "1024",
            "--kv-cache-memory", "64MiB", "--device", "cpu", "--kernels", "reference"]
    torchrun = ["-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port",
                str(free_port())]
    two = v4serve_process(base + ["-tp", "2"], launcher=torchrun)
    try:
        text = _ask(two.url)
        log = two.output()
    finally:
        two.stop()
    assert "torchrun rank 1 of 2" in log and "tensor parallel: 2 ranks (gloo), worker processes " in log
    one = v4serve_process(base)
    try:
        assert _ask(one.url) == text
    finally:
        one.stop()


def test_launcher_environment() -> None:
    assert from_environment({}) is None
    assert from_environment({"LOCAL_RANK": "0", "WORLD_SIZE": "1", "RANK": "0"}) is None  # one process: no layout
    env = {"LOCAL_RANK": "1", "WORLD_SIZE": "4", "RANK": "3", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1",
           "MASTER_PORT": "29500"}
    got = from_environment(env)
    assert (got.rank, got.world_size, got.local_rank, got.local_world_size) == (3, 4, 1, 2)
    assert (got.master_addr, got.master_port) == ("10.0.0.1", 29500)
    with pytest.raises(ValueError, match="MASTER_PORT"):
        from_environment({"LOCAL_RANK": "0", "WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "h"})


def test_torchrun_world_must_match_the_layout(monkeypatch, capsys) -> None:
    from v4serve.cli import main

    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "1")
    assert main(["serve", "tiny-v4-flash", "-tp", "4"]) == 2
    assert "torchrun started 2 processes" in capsys.readouterr().err
