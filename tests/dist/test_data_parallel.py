"""Data-parallel attention + expert parallelism (DEP) on real torch.distributed process groups (gloo): two ranks,
each with its own tokens, its own KV cache and half of the routed experts, exchanging tokens in every MoE layer,
give each of their sequences the logits one process gives it alone (float64, prefill and decode, a rank idle in a
step)."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from v4serve.models.factory import build_model

from .common import free_port as _port
from .common import rel_err as _rel
from .dep_worker import run_dep_rank, session


@pytest.mark.parametrize("model", ["tiny-v4-flash", "tiny-v4-pro", "tiny-v41-flash"])
def test_two_dep_ranks_equal_one_process(model: str, tmp_path) -> None:
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 129280, (n,), generator=g).tolist() for n in (70, 23)]
    follow = [11, 12]
    one = build_model(model, dtype=torch.float64, with_mtp=False, kernels="reference")
    want = [session(one, p, follow) for p in prompts]
    out = str(tmp_path / "rank")
    mp.spawn(run_dep_rank, args=(2, _port(), model, prompts, follow, out), nprocs=2, join=True)
    ranks = [torch.load(f"{out}.{r}") for r in range(2)]
    assert [len(r["logits"]) for r in ranks] == [3, 2]  # rank 1 sat the second decode step out
    for r, got in enumerate(ranks):
        for a, b in zip(got["logits"], want[r]):
            assert a.shape == b.shape
            assert _rel(a, b) < 1e-9
    whole = sum(t.numel() * t.element_size() for t in one.model.state_dict().values())
    experts = sum(t.numel() * t.element_size() for k, t in one.model.state_dict().items() if ".experts." in k)
    for r in ranks:  # each rank holds half of the routed experts and everything else
        assert abs(r["held"] - (whole - experts / 2)) < 0.01 * whole
