"""Checkpoints: the official layout written by write_checkpoint, the loader's errors, transformers'
save_pretrained output, and the tensor-/expert-parallel split rules."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from helpers import (
    PRESETS,
    checkpoint,
    ckpt_root,  # noqa: F401  (fixture)
    folder_model,
    hf_model,
    new_pools,
    one_shot,
    preset_model,
    tokens,
)
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from v4serve.config import load_config
from v4serve.models.checkpoint import write_checkpoint
from v4serve.models.factory import build_model
from v4serve.models.layout import tensor_specs
from v4serve.models.sharding import model_rules
from v4serve.models.step import RowSpec, build_step
from v4serve.models.weights import (
    CheckpointError,
    CheckpointReader,
    ParallelRank,
    check_and_iter,
    official_name,
    shard_for_rank,
)
from v4serve.presets import get_preset

FP8_SEED = 3


# --- the official layout and the fp8 round trip ------------------------------------------------------------

@pytest.fixture(scope="module")
def fp8_folder(tmp_path_factory) -> Path:
    """A tiny-v4-flash fp8 checkpoint split over several shards."""
    return write_checkpoint(get_preset("tiny-v4-flash"), tmp_path_factory.mktemp("fp8") / "ck", seed=FP8_SEED,
                            dtype="fp8", shard_bytes=8 << 20)


def test_written_checkpoint_has_the_official_layout(fp8_folder):
    c = get_preset("tiny-v4-flash")
    index = json.loads((fp8_folder / "model.safetensors.index.json").read_text())
    wm = index["weight_map"]
    shards = sorted(set(wm.values()))
    assert len(shards) > 1 and all((fp8_folder / s).is_file() for s in shards)
    for f in ("config.json", "inference/config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (fp8_folder / f).is_file(), f
    assert load_config(fp8_folder) == c.replace(name=fp8_folder.name)
    # every tensor of the layout, plus one scale per quantized weight, nothing else
    specs = tensor_specs(c)
    quantized = [s.name for s in specs if s.kind in ("dense", "expert")]
    assert set(wm) == {s.name for s in specs} | {n[: -len(".weight")] + ".scale" for n in quantized}

    def get(name: str) -> torch.Tensor:
        with safe_open(str(fp8_folder / wm[name]), "pt") as h:
            return h.get_tensor(name)

    wq_a = get("layers.2.attn.wq_a.weight")
    assert wq_a.dtype == torch.float8_e4m3fn and wq_a.shape == (c.q_lora_rank, c.dim)
    s = get("layers.2.attn.wq_a.scale")
    assert s.dtype == torch.float8_e8m0fnu and s.shape == (c.q_lora_rank // 32, c.dim // 32)  # weight_block 32
    w1 = get("layers.2.ffn.experts.0.w1.weight")
    assert w1.dtype == torch.int8 and w1.shape == (c.moe_inter_dim, c.dim // 2)  # FP4 packed two per byte
    s1 = get("layers.2.ffn.experts.0.w1.scale")
    assert s1.dtype == torch.float8_e8m0fnu and s1.shape == (c.moe_inter_dim, c.dim // 32)
    assert get("embed.weight").dtype == torch.bfloat16
    assert get("layers.0.ffn.gate.tid2eid").dtype == torch.int64  # hash-routed layer
    assert get("layers.2.ffn.gate.bias").dtype == torch.float32
    assert get("layers.2.hc_attn_fn").dtype == torch.float32


def test_fp8_checkpoint_loads_to_the_same_logits_as_the_in_memory_preset(fp8_folder):
    toks = tokens(90, 30)

    def run(lm):
        pools = new_pools(lm.config, with_mtp=True)
        with torch.no_grad():
            main = lm.model(build_step([RowSpec(toks, 0, 0, [0, 1], logits="all")]), pools)
            mtp = lm.model.mtp_forward(build_step([RowSpec(toks[1:] + [0], 0, 0, [0, 1], logits="all")]), pools,
                                       main.hidden)
        return main.logits, mtp.logits

    from_disk = run(build_model(str(fp8_folder)))  # MTP included
    in_memory = run(preset_model("tiny-v4-flash", seed=FP8_SEED, with_mtp=True))
    assert torch.equal(from_disk[0], in_memory[0])
    assert torch.equal(from_disk[1], in_memory[1])
    # and the seed matters (the comparison above is not trivially true)
    other = one_shot(preset_model("tiny-v4-flash", seed=0), toks)
    assert (other - in_memory[0]).abs().max() > 1e-2


def test_float32_checkpoint_of_another_preset_round_trips(ckpt_root):  # noqa: F811
    folder = checkpoint(ckpt_root, "tiny-v4-pro", 1, "float32")
    lm = folder_model(str(folder))
    # same geometry; an unquantized checkpoint declares unquantized weights
    assert lm.config.weight_dtype == "bf16" and lm.config.expert_dtype == "bf16"
    assert lm.config == get_preset("tiny-v4-pro").replace(name=folder.name, weight_dtype="bf16",
                                                          expert_dtype="bf16", weight_block=lm.config.weight_block)
    toks = tokens(60, 31)
    ref = one_shot(build_model("tiny-v4-pro", seed=1, storage="float32", with_mtp=False), toks)
    assert torch.equal(one_shot(lm, toks), ref)


# --- loader errors ----------------------------------------------------------------------------------------

def _tamper_copy(src: Path, dst: Path) -> Path:
    """A copy whose files are hard links; rewrite files only through _rewrite (which unlinks first)."""
    shutil.copytree(src, dst, copy_function=os.link)
    return dst


def _rewrite_shard(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    path.unlink()
    save_file(tensors, str(path), metadata={"format": "pt"})


def _edit(folder: Path, name: str, fn) -> None:
    """Apply fn(tensors, weight_map) to the shard holding `name` and rewrite shard and index."""
    ipath = folder / "model.safetensors.index.json"
    index = json.loads(ipath.read_text())
    shard = folder / index["weight_map"][name]
    tensors = load_file(str(shard))
    fn(tensors, index["weight_map"], shard.name)
    _rewrite_shard(shard, tensors)
    ipath.unlink()
    ipath.write_text(json.dumps(index))


def _drop(name):
    def fn(t, wm, _):
        del t[name], wm[name]
    return fn


def _reshape(name):
    def fn(t, wm, _):
        t[name] = t[name][:-1].contiguous()  # one output row short
    return fn


def _add(name, like):
    def fn(t, wm, shard):
        t[name] = torch.zeros_like(t[like])
        wm[name] = shard
    return fn


# case: (tensor whose shard is edited, edit, tensor the error must name, word the error must contain)
TAMPER = {
    "missing": ("layers.3.attn.compressor.ape", _drop("layers.3.attn.compressor.ape"),
                "layers.3.attn.compressor.ape", "missing"),
    "misshaped": ("layers.1.attn.wkv.weight", _reshape("layers.1.attn.wkv.weight"),
                  "layers.1.attn.wkv.weight", "shape"),
    "misshaped_expert": ("layers.4.ffn.experts.5.w2.weight", _reshape("layers.4.ffn.experts.5.w2.weight"),
                         "layers.4.ffn.experts.5.w2.weight", "shape"),
    # layer 1 of tiny-v4-flash is window-only: it has no compressor
    "extra": ("layers.3.attn.compressor.ape", _add("layers.1.attn.compressor.ape", "layers.3.attn.compressor.ape"),
              "layers.1.attn.compressor.ape", "unexpected"),
    "dense_without_scale": ("layers.2.attn.wq_b.scale", _drop("layers.2.attn.wq_b.scale"),
                            "layers.2.attn.wq_b.scale", "missing"),
    "expert_without_scale": ("layers.3.ffn.experts.7.w3.scale", _drop("layers.3.ffn.experts.7.w3.scale"),
                             "layers.3.ffn.experts.7.w3.scale", "missing"),
}


@pytest.mark.parametrize("case", list(TAMPER))
def test_loader_names_the_bad_tensor(fp8_folder, tmp_path, case):
    shard_of, fn, name, word = TAMPER[case]
    folder = _tamper_copy(fp8_folder, tmp_path / "ck")
    _edit(folder, shard_of, fn)
    with pytest.raises(CheckpointError) as e:
        build_model(str(folder))
    assert name in str(e.value) and word in str(e.value), str(e.value)
    # the original is untouched (the copy's files were re-created, not rewritten through the hard links)
    c = get_preset("tiny-v4-flash")
    assert sum(1 for _ in check_and_iter(CheckpointReader(fp8_folder), c, True)) == len(tensor_specs(c))


def test_extra_mtp_tensors_are_allowed_when_mtp_is_not_loaded(fp8_folder):
    lm = build_model(str(fp8_folder), with_mtp=False)
    assert len(lm.model.mtp) == 0


# --- transformers' save_pretrained output ---------------------------------------------------------------

@pytest.mark.parametrize("preset", PRESETS)
def test_transformers_save_pretrained_output_gives_the_same_logits(ckpt_root, tmp_path, preset):  # noqa: F811
    pytest.importorskip("transformers")
    folder = str(checkpoint(ckpt_root, preset, 1, "float32"))
    saved = tmp_path / "saved"
    hf_model(folder).save_pretrained(saved)
    # it really uses transformers' own names and config fields
    with safe_open(str(next(saved.glob("*.safetensors"))), "pt") as h:
        raw = set(h.keys())
    assert "model.embed_tokens.weight" in raw and "model.layers.0.attn.norm.weight" in raw
    cfg = json.loads((saved / "config.json").read_text())
    assert "compress_ratios" not in cfg and "layer_types" in cfg
    assert load_config(saved) == load_config(folder).replace(name="saved")
    toks = tokens(80, 32)
    for numerics in ("transformers", "deepseek"):
        a = one_shot(folder_model(folder, numerics), toks)
        b = one_shot(build_model(str(saved), numerics=numerics, with_mtp=False), toks)
        assert torch.equal(a, b), numerics


def test_official_name_maps_transformers_names():
    cases = {
        "model.embed_tokens.weight": "embed.weight",
        "lm_head.weight": "head.weight",
        "model.hc_head.hc_fn": "hc_head_fn",
        "model.hc_head.hc_scale": "hc_head_scale",
        "model.layers.3.attn.norm.weight": "layers.3.attn.kv_norm.weight",
        "model.layers.0.attn.wq_a.weight": "layers.0.attn.wq_a.weight",
        "model.norm.weight": "norm.weight",
    }
    for raw, want in cases.items():
        assert official_name(raw) == want, raw
    for spec in tensor_specs(get_preset("tiny-v4-flash")):  # official names pass through unchanged
        assert official_name(spec.name) == spec.name


# --- parallel split rules ---------------------------------------------------------------------------------

def _kind(name: str) -> str:
    """The split of each tensor under TP (docs in models/sharding.py), written out independently."""
    if name in ("embed.weight", "head.weight") or name.endswith(".engram.embed.weight"):
        return "vocab"
    if ".ffn.experts." in name or ".ffn.shared_experts." in name:
        return "row" if ".w2." in name else "column"
    for suffix in ("attn.wq_b.weight", "attn.wo_a.weight", "attn.attn_sink"):
        if name.endswith(suffix):
            return "column"
    if name.endswith("attn.wo_b.weight"):
        return "row"
    return "replicated"  # the indexer included: its scores sum over heads before the top-k


def test_shard_for_rank_tensor_parallel_halves_concatenate_back():
    c = get_preset("tiny-v4-flash")
    rules = model_rules(c)  # what the model's layers declare
    g = torch.Generator().manual_seed(0)
    seen = set()
    for spec in tensor_specs(c):
        shape = (1000, spec.shape[1]) if spec.name in ("embed.weight", "head.weight") else spec.shape
        t = torch.randn(*shape, generator=g) if spec.kind != "index" else torch.randint(0, 8, shape)
        kind = _kind(spec.name)
        seen.add(kind)
        parts = [shard_for_rank(spec.name, t, ParallelRank(tp_rank=r, tp_size=2), c.n_routed_experts,
                                rules.kind(spec.name)) for r in (0, 1)]
        if kind in ("column", "vocab"):
            assert parts[0].shape[0] == t.shape[0] // 2, spec.name
            assert torch.equal(torch.cat(parts, 0), t), spec.name
            if spec.name.endswith("attn_sink"):
                seen.add("sink")
        elif kind == "row":
            assert parts[0].shape[1] == t.shape[1] // 2, spec.name
            assert torch.equal(torch.cat(parts, 1), t), spec.name
        else:
            assert all(torch.equal(p, t) for p in parts), spec.name
    assert seen == {"vocab", "column", "row", "replicated", "sink"}
    # column-parallel by heads: rank 0 holds the first half of the heads of wq_b
    wq_b = torch.randn(c.n_heads * c.head_dim, c.q_lora_rank, generator=g)
    r0 = shard_for_rank("layers.2.attn.wq_b.weight", wq_b, ParallelRank(0, 2), c.n_routed_experts,
                        rules.kind("layers.2.attn.wq_b.weight"))
    assert torch.equal(r0.view(c.n_heads // 2, c.head_dim, -1), wq_b.view(c.n_heads, c.head_dim, -1)[: c.n_heads // 2])


def test_shard_for_rank_expert_parallel_assigns_each_expert_to_one_rank():
    c = get_preset("tiny-v4-flash")
    rules = model_rules(c)
    E = c.n_routed_experts
    owners: dict[int, list[int]] = {}
    for spec in tensor_specs(c):
        t = torch.ones(2, 2)
        got = [shard_for_rank(spec.name, t, ParallelRank(ep_rank=r, ep_size=2), E, rules.kind(spec.name))
               for r in (0, 1)]
        if ".ffn.experts." in spec.name:
            holders = [r for r, g in enumerate(got) if g is not None]
            assert len(holders) == 1, spec.name
            assert got[holders[0]] is t
            e = int(spec.name.split(".experts.")[1].split(".")[0])
            owners.setdefault(e, []).extend(holders)
        else:
            assert all(g is t for g in got), spec.name  # replicated across EP ranks
    assert sorted(owners) == list(range(E))
    for e, ranks in owners.items():
        assert len(set(ranks)) == 1  # w1, w2, w3 of an expert (in every layer) live on the same rank
    per_rank = [sum(1 for r in owners.values() if r[0] == k) for k in (0, 1)]
    assert per_rank == [E // 2, E // 2]


def test_parallel_rank_and_split_errors():
    with pytest.raises(ValueError):
        ParallelRank(tp_rank=2, tp_size=2)
    with pytest.raises(CheckpointError, match="experts"):
        shard_for_rank("layers.2.ffn.experts.1.w1.weight", torch.ones(2, 2), ParallelRank(ep_rank=0, ep_size=3), 8,
                       "expert")
    with pytest.raises(CheckpointError, match="layers.2.attn.wq_b.weight"):
        shard_for_rank("layers.2.attn.wq_b.weight", torch.ones(5, 2), ParallelRank(tp_rank=0, tp_size=2), 8,
                       "column")


def test_loading_shows_a_progress_bar_in_bytes(fp8_folder, monkeypatch, capsys):
    """A bar on stderr while a checkpoint loads (quiet below 1 GiB, so forced on here), ending at the checkpoint's
    stored bytes."""
    from v4serve.models import progress
    from v4serve.models.footprint import checkpoint_bytes

    monkeypatch.setattr(progress, "MIN_BYTES", 0)
    monkeypatch.delenv("V4SERVE_NO_PROGRESS", raising=False)
    build_model(str(fp8_folder), dtype=torch.float32, with_mtp=False)
    err = capsys.readouterr().err
    assert "Loading safetensors checkpoint" in err and "100%" in err
    total = sum(checkpoint_bytes(get_preset("tiny-v4-flash"), False).values())
    assert progress.load_bar(total, "x").total == total
