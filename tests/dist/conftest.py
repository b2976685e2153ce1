"""A checkpoint whose row-parallel inputs split on the 128-wide FP8 activation blocks (see test_tensor_parallel.py)."""

from __future__ import annotations

import pytest

from v4serve.models.checkpoint import write_checkpoint
from v4serve.presets import get_preset


@pytest.fixture(scope="session")
def tp_folder(tmp_path_factory) -> str:
    c = get_preset("tiny-v4-flash").replace(name="tiny-v4-tp", o_lora_rank=128, moe_inter_dim=256)
    return str(write_checkpoint(c, tmp_path_factory.mktemp("tp") / "ck", seed=3))


@pytest.fixture(scope="session")
def tp41_folder(tmp_path_factory) -> str:
    """tiny-v41-flash whose row-parallel inputs (wo_b: 2 groups x 32, the experts' w2: 64) split on its 32-wide FP8
    activation blocks at TP=2."""
    c = get_preset("tiny-v41-flash").replace(name="tiny-v41-tp", o_lora_rank=32, moe_inter_dim=64)
    return str(write_checkpoint(c, tmp_path_factory.mktemp("tp41") / "ck", seed=3))


@pytest.fixture(scope="session")
def tp_pro_folder(tmp_path_factory) -> str:
    c = get_preset("tiny-v4-pro").replace(name="tiny-v4-pro-tp", o_lora_rank=128, moe_inter_dim=256)
    return str(write_checkpoint(c, tmp_path_factory.mktemp("tp-pro") / "ck", seed=3))
