"""The `v4serve` command as a user runs it (offline parts; `serve` is covered by the server tests)."""

from __future__ import annotations

import json

from v4serve.cli import main


def test_generate_prints_one_result_per_prompt(capsys) -> None:
    rc = main(["generate", "tiny-v4-flash", "--prompt", "Hello", "--prompt", "world", "--max-tokens", "4",
               "--temperature", "0", "--json", "--kv-cache-memory", "32MiB"])
    assert rc == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert [x["prompt"] for x in lines] == ["Hello", "world"]
    assert all(len(x["token_ids"]) <= 4 for x in lines)


def test_make_checkpoint_then_generate_from_the_folder(tmp_path, capsys) -> None:
    out = tmp_path / "ck"
    assert main(["make-checkpoint", "--preset", "tiny-v4-flash", "--out", str(out), "--seed", "3"]) == 0
    assert (out / "config.json").is_file() and (out / "model.safetensors.index.json").is_file()
    assert (out / "inference" / "config.json").is_file() and (out / "tokenizer.json").is_file()
    args = ["--prompt", "Hi", "--max-tokens", "3", "--temperature", "0", "--json", "--kv-cache-memory", "32MiB"]
    assert main(["generate", str(out), *args]) == 0
    from_folder = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main(["generate", "tiny-v4-flash", "--seed", "3", *args]) == 0
    from_preset = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert from_folder["token_ids"] == from_preset["token_ids"], "the written checkpoint is the same model"


def test_bad_arguments_say_what_to_fix(capsys) -> None:
    assert main(["generate", "tiny-v4-flash", "--block-size", "7", "--prompt", "x"]) == 2
    assert "--block-size" in capsys.readouterr().err


def test_engine_flags_reach_the_engine_config() -> None:
    """--cuda-graph-sizes (vLLM's name), --chunk-graph-tokens and --[no-]warmup land in EngineConfig; graph sizes
    sorted, bad ones refused."""
    import pytest

    from v4serve.cli import build_parser, engine_kwargs
    from v4serve.engine.config import EngineConfig, EngineConfigError

    args = build_parser().parse_args(["serve", "tiny-v4-flash", "--cuda-graph-sizes", "8", "1", "4", "--no-warmup"])
    cfg = EngineConfig.from_kwargs(**engine_kwargs(args))
    assert cfg.cuda_graph_sizes == (1, 4, 8) and cfg.warmup is False
    default = EngineConfig.from_kwargs(**engine_kwargs(build_parser().parse_args(["serve", "tiny-v4-flash"])))
    assert default.cuda_graph_sizes == (1, 2, 4, 8, 16, 32, 64, 128) and default.warmup is None
    with pytest.raises(EngineConfigError, match="--cuda-graph-sizes"):
        EngineConfig(cuda_graph_sizes=(0, 4))
    args = build_parser().parse_args(["serve", "tiny-v4-flash", "--chunk-graph-tokens", "512", "256", "512"])
    assert EngineConfig.from_kwargs(**engine_kwargs(args)).chunk_graph_tokens == (256, 512)
    assert default.chunk_graph_tokens == ()
    with pytest.raises(EngineConfigError, match="--chunk-graph-tokens"):
        EngineConfig(chunk_graph_tokens=(-1,))
