"""Two "nodes" on localhost, as torch.distributed's multi-node launch sees them: `serve --nnodes 2 --node-rank 0`
(HTTP server, engine, rank 0) and `serve --nnodes 2 --node-rank 1` (rank 1 only) meet at --master-addr/--master-port
over gloo; the answer equals a single-process server's, and the second node exits when the first stops."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from .common import free_port as _port
from .test_serve_tp import _ask


def _ask_two(url: str) -> str:
    """Two different chats at once (DEP: the second goes to the other data-parallel rank, the first's is busy)."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="x")

    def chat(text: str) -> str:
        r = client.chat.completions.create(model="tp", messages=[{"role": "user", "content": text}], max_tokens=8,
                                           temperature=0)
        return r.choices[0].message.content or ""

    with ThreadPoolExecutor(2) as pool:
        return " | ".join(pool.map(chat, ["Say something.", "Count to three, slowly."]))


def _two_nodes(v4serve_process, folder: str, layout: list[str], tmp_path, ask=_ask) -> tuple[str, str]:
    """Serve `folder` with `layout` over two localhost "nodes"; (node 0's answer, node 1's log)."""
    base = [folder, "--served-model-name", "tp", "--block-size", "64", "--max-model-len", "1024",
            "--kv-cache-memory", "64MiB", "--device", "cpu", "--kernels", "reference"]
    multi = base + layout + ["--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", str(_port())]
    log = open(tmp_path / "node1.log", "w")
    node1 = subprocess.Popen([sys.executable, "-m", "v4serve.cli", "serve", *multi, "--node-rank", "1"],
                             stdout=log, stderr=subprocess.STDOUT)
    try:
        node0 = v4serve_process(multi)
        try:
            text = ask(node0.url)
        finally:
            node0.stop()
        assert node1.wait(timeout=60) == 0, (tmp_path / "node1.log").read_text()[-3000:]
    finally:
        if node1.poll() is None:
            node1.kill()
        log.close()
    one = v4serve_process(base)
    try:
        assert ask(one.url) == text
    finally:
        one.stop()
    return text, (tmp_path / "node1.log").read_text()


def test_two_nodes_on_localhost(v4serve_process, tp_folder: str, tmp_path) -> None:
    _, log = _two_nodes(v4serve_process, tp_folder, ["-tp", "2"], tmp_path)
    assert "tensor-parallel ranks 1..1" in log


def test_dep_over_two_nodes_on_localhost(v4serve_process, tp_folder: str, tmp_path) -> None:
    """DEP across machines: node 0 runs the engine (every data-parallel rank's scheduler) and data-parallel rank 0,
    node 1 data-parallel rank 1; the answer is a single process's."""
    _, log = _two_nodes(v4serve_process, tp_folder, ["-dp", "2", "--enable-expert-parallel"], tmp_path, _ask_two)
    assert "data-parallel (DEP) ranks 1..1" in log


def test_multi_node_flags_are_checked(capsys) -> None:
    from v4serve.cli import main

    assert main(["serve", "tiny-v4-flash", "-tp", "2", "--nnodes", "2"]) == 2
    assert "--master-addr" in capsys.readouterr().err
    assert main(["serve", "tiny-v4-flash", "-tp", "3", "--nnodes", "2", "--master-addr", "h", "--master-port", "1"]) == 2
    assert "nnodes" in capsys.readouterr().err


pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")
