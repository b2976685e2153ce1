"""`v4serve serve MODEL -dp 2 --enable-expert-parallel` (vLLM's flags) on the CPU: the engine process starts a second
data-parallel rank over gloo; chat completions come back through the official `openai` client with a single-rank
server's greedy text, the session's second turn lands on the rank holding its prefix, /health and /metrics answer,
and a dead rank turns /health to 503."""

from __future__ import annotations

import os
import signal
import time

import httpx
import openai
import pytest

from .common import healthy

FIRST = [{"role": "user", "content": "Say something about the sea, the wind and the long road home, about the "
          "harbour lights at night, the gulls over the pier, the salt on the windows of the old house by the dunes, "
          "and the boats that come back late in autumn when the fog rolls in from the grey water."}]


def _chat(url: str, messages: list[dict]) -> tuple[str, int]:
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=300)
    r = client.chat.completions.create(model="dp", messages=messages, max_tokens=8, temperature=0)
    cached = r.usage.prompt_tokens_details.cached_tokens if r.usage.prompt_tokens_details else 0
    return r.choices[0].message.content or "", cached or 0


def _session(url: str) -> tuple[str, str, int]:
    first, _ = _chat(url, FIRST)
    second, cached = _chat(url, FIRST + [{"role": "assistant", "content": first},
                                         {"role": "user", "content": "And then?"}])
    return first, second, cached


def test_serve_with_data_parallel_size_2(v4serve_process, tp_folder: str) -> None:
    args = [tp_folder, "--served-model-name", "dp", "--block-size", "16", "--max-model-len", "1024",
            "--kv-cache-memory", "64MiB", "--device", "cpu", "--kernels", "reference"]
    two = v4serve_process(args + ["--data-parallel-size", "2", "--enable-expert-parallel"])
    try:
        first, second, cached = _session(two.url)
        assert cached > 0  # the second turn went to the rank that served the first
        assert "data parallel + expert parallel (DEP): 2 ranks (gloo)" in two.output()
        assert httpx.get(two.url + "/health").status_code == 200
        metrics = httpx.get(two.url + "/metrics").text
        assert "num_requests_running" in metrics and "kv_cache_usage" in metrics
        worker = _worker_pid(two.output())
        os.kill(worker, signal.SIGKILL)  # rank 1 dies: the engine reports it and exits, /health fails, the server stops
        with pytest.raises(openai.APIError):
            _chat(two.url, [{"role": "user", "content": "Are you there?"}])
        deadline = time.monotonic() + 60
        while healthy(two.url) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not healthy(two.url)
    finally:
        two.stop()
    one = v4serve_process(args)
    try:
        assert _session(one.url) == (first, second, cached)
    finally:
        one.stop()


def _worker_pid(log: str) -> int:
    line = next(ln for ln in log.splitlines() if "worker processes" in ln)
    return int(line.rsplit("worker processes", 1)[1].strip().split(",")[0])


pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")
