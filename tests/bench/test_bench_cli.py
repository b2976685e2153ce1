"""`register_bench` wiring: flags, defaults, and the handlers run end to end on the stand-in."""

import argparse
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the stand-in server next to this file
from fake_openai_server import FakeOpenAIServer, FakeServerConfig

from v4serve.bench.cli import build_trace_source, register_bench


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="v4serve")
    register_bench(parser.add_subparsers(dest="command"))
    return parser


def test_agentic_flags_and_defaults():
    args = _parser().parse_args(
        [
            "bench",
            "agentic",
            "--base-url",
            "http://h:1",
            "--concurrency",
            "1,4,16",
            "--duration",
            "60",
            "--out",
            "d",
            "--num-gpus",
            "8",
            "--slo-interactivity",
            "150",
            "--extra-body",
            '{"top_k": 1}',
        ]
    )
    assert args.concurrency == [1, 4, 16] and args.duration == 60 and args.num_gpus == 8
    assert args.slo_interactivity == [150.0] and args.extra_body == {"top_k": 1}
    assert (args.trace, args.scale, args.warmup_requests, args.start_range) == (
        "synthetic",
        1.0,
        10,
        [0.25, 0.75],
    )
    assert args.func.__name__ == "cmd_agentic"
    source, extra = build_trace_source(args)
    assert source.name == "synthetic" and extra["synthetic_config"]["scale"] == 1.0


def test_serve_and_plot_flags():
    p = _parser()
    args = p.parse_args(
        [
            "bench",
            "serve",
            "--base-url",
            "u",
            "--input-len",
            "8192",
            "--output-len",
            "1024",
            "--num-prompts",
            "512",
            "--max-concurrency",
            "32",
            "--goodput",
            "ttft:2000",
            "tpot:50",
        ]
    )
    assert (args.input_len, args.output_len, args.num_prompts, args.max_concurrency) == (8192, 1024, 512, 32)
    assert args.request_rate == float("inf") and args.goodput == ["ttft:2000", "tpot:50"]
    args = p.parse_args(["bench", "plot", "a.json", "b.json", "--out", "x.png", "--labels", "on,off"])
    assert args.results == ["a.json", "b.json"] and args.labels == ["on", "off"]
    with pytest.raises(SystemExit):
        p.parse_args(["bench"])  # a sub-command is required


def test_agentic_and_serve_commands_write_results(tmp_path, capsys):
    with FakeOpenAIServer(FakeServerConfig(ttft_s=0.001, itl_s=0.0005)) as server:
        p = _parser()
        args = p.parse_args(
            [
                "bench",
                "agentic",
                "--base-url",
                server.base_url + "/v1",
                "--concurrency",
                "1,2",
                "--duration",
                "0.5",
                "--out",
                str(tmp_path),
                "--scale",
                "0.002",
                "--output-scale",
                "0.01",
                "--warmup-requests",
                "1",
                "--think-time-scale",
                "0",
                "--no-progress",
                "--label",
                "stand-in",
                "--cache-salt",
            ]
        )
        assert args.func(args) == 0
        args = p.parse_args(
            [
                "bench",
                "serve",
                "--base-url",
                server.base_url,
                "--input-len",
                "32",
                "--output-len",
                "4",
                "--num-prompts",
                "5",
                "--out",
                str(tmp_path),
                "--no-progress",
            ]
        )
        assert args.func(args) == 0
        assert all("cache_salt" in b for b in server.requests if "messages" in b)
    (agentic,) = tmp_path.glob("agentic-*.json")
    doc = json.loads(agentic.read_text())
    assert doc["label"] == "stand-in" and [p["concurrency"] for p in doc["points"]] == [1, 2]
    assert doc["trace"]["source"] == "synthetic" and doc["server_models"]["data"][0]["id"] == "fake-v4"
    assert doc["trace"]["synthetic_config"]["max_context"] == 2000  # min(server max_model_len, 1M x scale)
    assert doc["command"][:3] == ["v4serve", *doc["command"][1:3]]
    assert list(tmp_path.glob("agentic-*.md")) and list(tmp_path.glob("agentic-*.png"))
    (serve,) = tmp_path.glob("serve-*.json")
    assert json.loads(serve.read_text())["completed"] == 5
    out = capsys.readouterr().out
    assert "| conc |" in out and "Serving Benchmark Result" in out
    png = tmp_path / "again.png"
    args = p.parse_args(["bench", "plot", str(agentic), str(agentic), "--out", str(png), "--labels", "a,b"])
    assert args.func(args) == 0 and png.exists()


def test_bench_and_eval_send_the_api_key(tmp_path, monkeypatch):
    monkeypatch.delenv("V4SERVE_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with FakeOpenAIServer(FakeServerConfig(ttft_s=0.001, itl_s=0.0005, api_key="sekret")) as server:
        p = _parser()
        serve = ["bench", "serve", "--base-url", server.base_url, "--input-len", "16", "--output-len", "2",
                 "--num-prompts", "2", "--out", str(tmp_path), "--no-progress"]
        args = p.parse_args([*serve, "--api-key", "sekret"])
        assert args.func(args) == 0
        (doc,) = tmp_path.glob("serve-*.json")
        assert json.loads(doc.read_text())["completed"] == 2 and "sekret" not in doc.read_text()
        args = p.parse_args(serve)  # no key: the server refuses every request
        with pytest.raises(SystemExit):
            assert args.func(args) != 0
