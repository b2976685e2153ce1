"""Tensor parallelism on real torch.distributed process groups (gloo on the CPU): two ranks, each loading only its
part of an official-format checkpoint, give the same logits as one process, for a prefill and a decode step.

The test model is tiny-v4-flash with o_lora_rank 128 and expert width 256, so that every row-parallel input (wo_b,
the experts' w2) splits on the 128-wide FP8 activation-quantization blocks: each rank then quantizes exactly the values
one process would, and the float64 logits agree to rounding.
"""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from v4serve.models.factory import build_model
from v4serve.models.sharding import rank_config
from v4serve.presets import get_preset

from .common import free_port as _port
from .common import rel_err as _rel
from .tp_worker import logits_of, run_rank


@pytest.mark.parametrize("ep", [False, True], ids=["experts-sliced", "expert-parallel"])
def test_two_ranks_equal_one_process(tp_folder: str, tmp_path, ep: bool) -> None:
    """Experts sliced across the ranks, or (EP) each rank holding half of them whole."""
    folder = tp_folder
    toks = torch.randint(0, 129280, (70,), generator=torch.Generator().manual_seed(5)).tolist()
    one = build_model(folder, dtype=torch.float64, with_mtp=False, kernels="reference")
    want = logits_of(one, toks, toks[0])
    out = str(tmp_path / "rank")
    mp.spawn(run_rank, args=(2, _port(), folder, toks, out, ep), nprocs=2, join=True)
    ranks = [torch.load(f"{out}.{r}") for r in range(2)]
    for got in ranks:  # every rank ends with the whole vocabulary's logits
        assert _rel(got["logits"][0], want[0]) < 1e-9
        assert _rel(got["logits"][1], want[1]) < 1e-9
    whole = sum(t.numel() * t.element_size() for t in one.model.state_dict().values())
    assert all(r["held"] < 0.75 * whole for r in ranks)  # each rank holds its share, not a copy


def test_rank_config_and_uneven_splits() -> None:
    c = get_preset("v4-flash")
    r = rank_config(c, 4)
    assert (r.n_heads, r.o_groups, r.moe_inter_dim) == (16, 2, 512)
    assert rank_config(c, 4, expert_parallel=True).moe_inter_dim == c.moe_inter_dim  # EP: experts whole
    with pytest.raises(ValueError, match="attention heads"):
        rank_config(c, 3)
