"""Tensor parallelism for DeepSeek-V4.1 on gloo: two ranks, each loading only its share of an official-format
checkpoint (heads, sinks, wo_a groups, expert slices or whole experts, vocabulary, Engram table rows), give one
process's logits through chunked prefill (the decoder trim included, down to a chunk it skips entirely) and decode."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from v4serve.models.factory import build_model

from .common import free_port as _port
from .common import rel_err as _rel
from .tp41_worker import run_rank, v41_session


@pytest.mark.parametrize("ep", [False, True], ids=["experts-sliced", "expert-parallel"])
def test_two_v41_ranks_equal_one_process(tp41_folder: str, tmp_path, ep: bool) -> None:
    toks = torch.randint(0, 129280, (70,), generator=torch.Generator().manual_seed(5)).tolist()
    follow = [11, 12, 13]
    one = build_model(tp41_folder, dtype=torch.float64, with_mtp=False, kernels="reference")
    want = v41_session(one, toks, follow)
    out = str(tmp_path / "rank")
    mp.spawn(run_rank, args=(2, _port(), tp41_folder, toks, follow, out, ep), nprocs=2, join=True)
    ranks = [torch.load(f"{out}.{r}") for r in range(2)]
    for got in ranks:  # every rank ends with the whole vocabulary's logits
        assert len(got["logits"]) == len(want) == 5
        for a, b in zip(got["logits"], want):
            assert a.shape == b.shape
            assert _rel(a, b) < 1e-9
    whole = sum(t.numel() * t.element_size() for t in one.model.state_dict().values())
    assert all(r["held"] < 0.75 * whole for r in ranks)  # each rank holds its share, not a copy
    rows = sum(one.config.engram_num_embeddings)
    assert sum(r["table_rows"] for r in ranks) == rows * one.config.engram_head_dim  # Engram rows split, not copied


def test_v41_draft_blocks_are_refused_under_tp() -> None:
    """DSpark's draft reads the whole embedding, head and Markov head: not split yet, so refused with TP (the engine
    says so before any worker starts)."""
    from v4serve.dist.parallel import TensorParallel
    from v4serve.engine.config import EngineConfigError
    from v4serve.engine.llm import LLM

    with pytest.raises(NotImplementedError, match="DSpark"):
        build_model("tiny-v41-flash", dtype=torch.float64, with_mtp=True, tp=TensorParallel(0, 2))
    with pytest.raises(EngineConfigError, match="DSpark"):
        LLM("tiny-v41-flash", device="cpu", tensor_parallel_size=2, with_mtp=True)
