"""Two "nodes" on localhost, as torch.distributed's multi-node launch sees them: `serve --nnodes 2 --node-rank 0`
(HTTP server, engine, rank 0) and `serve --nnodes 2 --node-rank 1` (rank 1 only) meet at --master-addr/--master-port
over gloo; the answer equals a single-process server's, and the second node exits when the first stops."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .common import free_port as _port
from .test_serve_tp import _ask


def test_two_nodes_on_localhost(v4serve_process, tp_folder: str, tmp_path) -> None:
    base = [tp_folder, "--served-model-name", "tp", "--block-size", "64", "--max-model-len", "1024",
            "--kv-cache-memory", "64MiB", "--device", "cpu", "--kernels", "reference"]
    multi = base + ["-tp", "2", "--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", str(_port())]
    log = open(tmp_path / "node1.log", "w")
    node1 = subprocess.Popen([sys.executable, "-m", "v4serve.cli", "serve", *multi, "--node-rank", "1"],
                             stdout=log, stderr=subprocess.STDOUT)
    try:
        node0 = v4serve_process(multi)
        try:
            text = _ask(node0.url)
        finally:
            node0.stop()
        assert node1.wait(timeout=60) == 0, (tmp_path / "node1.log").read_text()[-3000:]
    finally:
        if node1.poll() is None:
            node1.kill()
        log.close()
    assert "tensor-parallel ranks 1..1" in (tmp_path / "node1.log").read_text()
    one = v4serve_process(base)
    try:
        assert _ask(one.url) == text
    finally:
        one.stop()


def test_multi_node_flags_are_checked(capsys) -> None:
    from v4serve.cli import main

    assert main(["serve", "tiny-v4-flash", "-tp", "2", "--nnodes", "2"]) == 2
    assert "--master-addr" in capsys.readouterr().err
    assert main(["serve", "tiny-v4-flash", "-tp", "3", "--nnodes", "2", "--master-addr", "h", "--master-port", "1"]) == 2
    assert "nnodes" in capsys.readouterr().err


pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")
