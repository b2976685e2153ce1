"""`v4serve serve MODEL -tp 2` (vLLM's flag) on the CPU: the engine process starts a worker rank over gloo and a chat
completion comes back through the official `openai` client; greedy text equals a single-rank server's."""

from __future__ import annotations

import openai


def _ask(url: str) -> str:
    client = openai.OpenAI(base_url=url + "/v1", api_key="x")
    r = client.chat.completions.create(model="tp", messages=[{"role": "user", "content": "Say something."}],
                                       max_tokens=8, temperature=0)
    return r.choices[0].message.content or ""


def test_serve_with_tensor_parallel_size_2(v4serve_process, tp_folder: str) -> None:
    args = [tp_folder, "--served-model-name", "tp", "--block-size", "64", "--max-model-len", "1024",
            "--kv-cache-memory", "64MiB", "--device", "cpu", "--kernels", "reference"]
    two = v4serve_process(args + ["--tensor-parallel-size", "2"])
    try:
        text = _ask(two.url)
        assert "tensor parallel: 2 ranks (gloo)" in two.output()
    finally:
        two.stop()
    one = v4serve_process(args)
    try:
        assert _ask(one.url) == text
    finally:
        one.stop()
