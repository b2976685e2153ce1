"""GPU memory kept out of the KV budget (engine/memory.py): the MoE prefill's working set where its grouped body
applies (ops/kernels/moe_grouped.py)."""

from __future__ import annotations

import torch
from torch import nn

from v4serve.engine.memory import activation_reserve
from v4serve.models import footprint
from v4serve.models.v4.moe import Experts
from v4serve.ops.kernels import moe_grouped as mg
from v4serve.presets import get_preset


def test_reserve_holds_the_grouped_moe_working_set(monkeypatch):
    monkeypatch.delenv(mg.SCRATCH_ENV, raising=False)
    c = get_preset("v4-flash")
    base = activation_reserve(c, 8192, (0, 0))
    # 16 whole V4-Flash experts: their bf16 copies (805 MB) and 8K x 6 sorted rows
    e16 = activation_reserve(c, 8192, (16, c.moe_inter_dim))
    assert e16 - base == mg.scratch_bytes(16, c.dim, c.moe_inter_dim) + 8192 * 6 * (2 * c.dim + 3 * c.moe_inter_dim) * 2
    # all 256 on one rank: 12.9 GB of copies, over the default budget, so the dot body runs and nothing is reserved
    assert activation_reserve(c, 8192) == base
    monkeypatch.setenv(mg.SCRATCH_ENV, str(16 << 30))
    assert activation_reserve(c, 8192) > base + (12 << 30)


def test_fp4_routed_experts_of_a_model():
    c = get_preset("tiny-v4-flash")
    ex = Experts(c, 4)
    assert footprint.fp4_routed_experts(nn.Sequential(ex)) == (0, 0)  # nothing loaded
    ex.w1 = torch.zeros(4, c.moe_inter_dim, c.dim // 2, dtype=torch.uint8)
    assert footprint.fp4_routed_experts(nn.Sequential(nn.Linear(2, 2), ex)) == (4, c.moe_inter_dim)
    ex.w1 = torch.zeros(4, c.moe_inter_dim, c.dim)
    assert footprint.fp4_routed_experts(ex) == (0, 0)
