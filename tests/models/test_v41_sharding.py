"""The tensor-parallel split rules, as the layers declare them (ops/shard.py, models/sharding.py), cover every tensor of
every family (checked against the rules written out here), and slice every tensor of a V4.1 trunk: heads,
sinks and wo_a groups by rows, wo_b by columns, embedding / head / Engram tables by rows (the tables unevenly), the
KV sources' compressors, index keys, indexer, router biases and Engram's projections replicated."""

from __future__ import annotations

import re

import pytest
import torch

from v4serve.models.sharding import model_rules, row_share
from v4serve.models.layout import tensor_specs
from v4serve.models.v41.layout import v41_tensor_specs
from v4serve.models.weights import ParallelRank, shard_for_rank, shard_stored
from v4serve.presets import get_preset

_WANT = [  # (pattern, kind) in order; the first match decides
    (r"ffn\.experts\.", "expert"), (r"ffn\.shared_experts\.w[13]\.", "expert-in"),
    (r"ffn\.shared_experts\.w2\.", "expert-out"), (r"attn\.(wq_b\.weight|wo_a\.weight|attn_sink)$", "column"),
    (r"attn\.wo_b\.weight$", "row"), (r"^(embed|head)\.weight$|engram\.embed\.weight$", "vocab"), (r".", "replicated"),
]


def _want(name: str) -> str:
    return next(k for p, k in _WANT if re.search(p, name))


def test_every_v41_tensor_has_its_split_and_halves_concatenate_back() -> None:
    c = get_preset("tiny-v41-flash")
    g = torch.Generator().manual_seed(0)
    seen = set()
    rules = model_rules(c)  # what the model's layers declare
    for spec in v41_tensor_specs(c, include_mtp=False):
        kind = rules.kind(spec.name)
        assert kind == _want(spec.name), spec.name
        seen.add(kind)
        shape = (1000, spec.shape[1]) if spec.name in ("embed.weight", "head.weight") else spec.shape
        t = torch.randn(*shape, generator=g)
        parts = [shard_for_rank(spec.name, t, ParallelRank(tp_rank=r, tp_size=2), c.n_routed_experts, kind)
                 for r in (0, 1)]
        if kind in ("column", "vocab", "expert-in") or (kind == "expert" and ".w2." not in spec.name):
            assert torch.equal(torch.cat(parts, 0), t), spec.name
            assert parts[0].shape[0] == -(-t.shape[0] // 2), spec.name
        elif kind in ("row", "expert-out", "expert"):
            assert torch.equal(torch.cat(parts, 1), t), spec.name
        else:
            assert all(torch.equal(p, t) for p in parts), spec.name
    assert seen == {"column", "row", "vocab", "expert", "expert-in", "expert-out", "replicated"}
    assert any(".indexer.wk." in s.name for s in v41_tensor_specs(c, False))  # index keys: replicated above


def test_fp8_engram_rows_split_unevenly_with_their_scales() -> None:
    rows, hd = 6091, 64
    t = torch.randn(rows, hd).to(torch.float8_e4m3fn)
    scale = torch.randint(100, 140, (rows, hd // 32), dtype=torch.uint8)
    got = [shard_stored("layers.1.engram.embed.weight", t, scale, ParallelRank(tp_rank=r, tp_size=3), 8, "vocab")
           for r in range(3)]
    assert [p[0].shape[0] for p in got] == [2031, 2031, 2029] == [hi - lo for lo, hi in (row_share(rows, 3, r)
                                                                                          for r in range(3))]
    assert torch.equal(torch.cat([p[0] for p in got]).view(torch.uint8), t.view(torch.uint8))
    assert torch.equal(torch.cat([p[1] for p in got]), scale)


def test_info_prints_v41_bytes_per_rank(capsys) -> None:
    from v4serve.cli import main

    for preset in ("tiny-v41-flash", "v41-flash"):
        assert main(["info", preset, "-tp", "2"]) == 0
        out = capsys.readouterr().out
        assert "TP=2 on 2 GPU(s)" in out and "GB per GPU" in out


@pytest.mark.parametrize("preset", ["tiny-v4-flash", "tiny-v4-pro", "tiny-v41-flash", "v4-flash", "v41-flash"])
def test_the_layers_declare_every_split(preset: str) -> None:
    """What the layers declare (Linear(..., shard=), modules' shard_rules; read off a meta-device skeleton) gives
    every checkpoint tensor, MTP / draft blocks included, the split written out independently above."""
    c = get_preset(preset)
    rules = model_rules(c)
    wrong = [(s.name, rules.kind(s.name), _want(s.name)) for s in tensor_specs(c, include_mtp=True)
             if rules.kind(s.name) != _want(s.name)]
    assert not wrong, wrong[:5]


def test_a_layer_declares_its_split() -> None:
    from torch import nn

    from v4serve.models.sharding import rules_of
    from v4serve.ops.linear import Linear
    from v4serve.ops.shard import COLUMN, EXPERT

    m = nn.Module()
    m.proj = Linear(4, 8, shard=COLUMN)
    m.keep = Linear(4, 8)
    m.shard_rules = {"experts.": EXPERT}
    rules = rules_of(m)
    assert rules.kind("proj.weight") == rules.kind("proj.scale") == COLUMN
    assert rules.kind("keep.weight") == "replicated" and rules.kind("experts.3.w1.weight") == EXPERT
    m.shard_rules = {"w": "diagonal"}
    with pytest.raises(ValueError, match="unknown split"):
        rules_of(m)
