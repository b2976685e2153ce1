"""A checkpoint whose row-parallel inputs split on the 128-wide FP8 activation blocks (see test_tensor_parallel.py)."""

from __future__ import annotations

import pytest

from v4serve.models.checkpoint import write_checkpoint
from v4serve.presets import get_preset


@pytest.fixture(scope="session")
def tp_folder(tmp_path_factory) -> str:
    c = get_preset("tiny-v4-flash").replace(name="tiny-v4-tp", o_lora_rank=128, moe_inter_dim=256)
    return str(write_checkpoint(c, tmp_path_factory.mktemp("tp") / "ck", seed=3))
