"""vLLM's DeepSeek-V4 launch command starts v4serve (single-GPU form): flags mapped, accepted with a note, or
refused with a message saying what cannot run yet; sizes parsed one way everywhere."""

from __future__ import annotations

import argparse
import asyncio
import logging

import httpx
import openai
import pytest

from v4serve.cli import build_parser, main
from v4serve.engine.config import EngineConfig
from v4serve.server.vllm_compat import apply_vllm_args
from v4serve.sizes import parse_bytes, parse_tokens

VLLM_V4 = ["--model", "tiny-v4-flash", "--tensor-parallel-size", "1", "--data-parallel-size", "1",
           "--enable-expert-parallel", "--trust-remote-code", "--kv-cache-dtype", "fp8", "--block-size", "64",
           "--max-model-len", "2k", "--kv-cache-memory-bytes", "128MiB", "--tokenizer-mode", "deepseek_v4",
           "--tool-call-parser", "deepseek_v4", "--enable-auto-tool-choice", "--reasoning-parser", "deepseek_v4",
           "--enable-log-requests", "--disable-log-stats", "--disable-uvicorn-access-log",
           "--allowed-origins", '["https://app.example"]', "--api-key", "k1", "--api-key", "k2",
           "--device", "cpu"]


def serve_args(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(["serve", *argv])


def test_sizes_are_parsed_one_way() -> None:
    assert parse_tokens("131072") == 131072 and parse_tokens("128k") == 128_000 and parse_tokens("128K") == 131072
    assert parse_tokens("1M") == 1 << 20 and parse_tokens("1m") == 1_000_000
    assert parse_bytes("8GiB") == parse_bytes("8G") == parse_bytes("8g") == 8 << 30 and parse_bytes("64k") == 65536
    for bad in ("", "12x", "-5", "0"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_tokens(bad)
        with pytest.raises(argparse.ArgumentTypeError):
            parse_bytes(bad)


def test_flags_map_onto_v4serve_options(caplog: pytest.LogCaptureFixture) -> None:
    args = serve_args(VLLM_V4)
    with caplog.at_level(logging.INFO, logger="v4serve.server"):
        apply_vllm_args(args)
    assert args.model == "tiny-v4-flash" and args.kv_cache_memory == 128 << 20 and args.max_model_len == 2000
    assert args.access_log is False and args.api_key == ["k1", "k2"]
    assert args.allowed_origins == ["https://app.example"]
    notes = " ".join(r.getMessage() for r in caplog.records)
    for flag in ("--trust-remote-code", "--tokenizer-mode", "--tool-call-parser", "--reasoning-parser"):
        assert flag in notes
    for alias, ours in (("bfloat16", "bf16"), ("fp8_e4m3", "fp8"), ("fp8_ds_mla", "fp8")):
        assert EngineConfig(kv_cache_dtype=alias).kv_cache_dtype == ours


@pytest.mark.parametrize("extra, message", [
    (["--data-parallel-size", "2"], "data-parallel attention"),
    (["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}'], "speculative decoding"),
    (["--kv-cache-memory", "1GiB", "--kv-cache-memory-bytes", "2GiB"], "disagree"),
    (["--ssl-keyfile", "k.pem"], "--ssl-certfile"),
])
def test_what_cannot_run_yet_says_so(extra: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    assert main(["serve", "tiny-v4-flash", *extra]) == 2
    assert message in capsys.readouterr().err


def test_vllm_launch_command_serves(v4serve_process) -> None:
    server = v4serve_process(VLLM_V4)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="k2", max_retries=0, timeout=120)
    out = client.chat.completions.create(model="tiny-v4-flash", messages=[{"role": "user", "content": "hi"}],
                                         max_tokens=3, temperature=0)
    assert out.choices[0].message is not None and out.usage.completion_tokens <= 3
    assert httpx.get(server.url + "/v1/models", headers={"Authorization": "Bearer k1"}).status_code == 200
    assert httpx.get(server.url + "/v1/models", headers={"Authorization": "Bearer k3"}).status_code == 401
    pre = httpx.options(server.url + "/v1/chat/completions", headers={
        "Origin": "https://app.example", "Access-Control-Request-Method": "POST"})
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "https://app.example"
    assert "request POST /v1/chat/completions" in server.output()


async def test_periodic_stats_line(caplog: pytest.LogCaptureFixture) -> None:
    from v4serve.server.stats_log import log_stats, stats_line, totals

    snapshots = iter([{"prompt_tokens": 0, "cached_tokens": 0, "running": 0, "waiting": 0, "kv_usage": 0.0},
                      {"prompt_tokens": 1000, "cached_tokens": 900, "running": 2, "waiting": 1, "kv_usage": 0.25}]
                     + [{"prompt_tokens": 1000, "cached_tokens": 900}] * 100)
    generated = iter([0, 50] + [50] * 100)

    class Client:
        async def stats(self) -> dict:
            return next(snapshots)

    with caplog.at_level(logging.INFO, logger="v4serve.server"):
        task = asyncio.ensure_future(log_stats(Client(), lambda: next(generated), 0.01))
        await asyncio.sleep(0.2)
        task.cancel()
    lines = [r.getMessage() for r in caplog.records if "throughput" in r.getMessage()]
    assert len(lines) == 1  # idle intervals print nothing
    assert "running 2, waiting 1" in lines[0] and "KV cache usage 25.0%" in lines[0]
    assert "prefix cache hit rate 90.0% (this interval)" in lines[0]
    line = stats_line({}, totals({"prompt_tokens": 10}, 0, 0.0), totals({"prompt_tokens": 110, "cached_tokens": 0},
                                                                         20, 2.0))
    assert "prompt throughput 50.0 tok/s" in line and "generation throughput 10.0 tok/s" in line
    # the engine's step times by kind, as differences between the two readings
    from v4serve.engine.step_stats import StepStats

    steps = StepStats()
    steps.observe(8, 0, 0.0025)
    before = steps.as_dict()
    steps.observe(8, 300, 0.025)
    line = stats_line({}, totals({"step_stats": before}, 0, 0.0), totals({"step_stats": steps.as_dict()}, 0, 1.0))
    assert line.endswith("; steps: mixed 1 (p50 <= 30 / p90 <= 30 ms; 300 prefill tokens each)")
