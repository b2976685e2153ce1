"""The engine with --tensor-parallel-size 2: rank 0 schedules and samples, a spawned worker process runs the other
half of the model on its own KV pools, over gloo. Greedy generations equal the single-process engine's, through
prefill chunks, decode steps and a prefix-cache hit (slot operations replayed on the worker); for V4.1 also through
preemptions (a KV cache of six blocks), in its exact prefix-hit mode."""

from __future__ import annotations

import os

import pytest
import torch

from v4serve.cache.spec import make_cache_spec
from v4serve.engine.llm import LLM
from v4serve.engine.sampling_params import SamplingParams
from v4serve.models.factory import resolve_config

OPTS = dict(device="cpu", dtype="float64", kv_cache_memory=64 << 20, max_model_len=512, block_size=64,
            max_num_batched_tokens=96, kernels="reference")


def _generate(folder: str, tp: int, ep: bool = False, graphs: bool = False) -> list[list[int]]:
    """graphs: decode steps through the decode graphs' static buffers (eager stand-ins on the CPU), replayed by every
    rank from rank 0's prepared inputs."""
    extra = dict(graph_stand_ins=True, cuda_graph_sizes=(1, 2, 4)) if graphs else {}
    llm = LLM(folder, tensor_parallel_size=tp, enable_expert_parallel=ep, **OPTS, **extra)
    assert (llm.engine.peers is not None and llm.engine.peers.size == 2) == (tp == 2)
    try:
        g = torch.Generator().manual_seed(2)
        base = torch.randint(0, 129280, (150,), generator=g).tolist()
        prompts = [base, base[:140] + [7, 8, 9], torch.randint(0, 129280, (40,), generator=g).tolist()]
        sp = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
        first = llm.generate(prompts[:1], sp)  # then a prefix hit on the first 128 tokens (a window checkpoint copied)
        rest = llm.generate(prompts[1:], sp)
        assert rest[0].num_cached_tokens == 128
        graphed = llm.engine.runner.graphs
        assert (graphed is not None and graphed.replays >= 10) == graphs  # 5 decode steps of each generate
        return [o.outputs[0].token_ids for o in first + rest]
    finally:
        llm.close()


@pytest.mark.parametrize("fixture", ["tp_folder", "tp_pro_folder"], ids=["v4-flash", "v4-pro"])
def test_tensor_parallel_engine_generates_what_one_process_does(fixture: str, request: pytest.FixtureRequest) -> None:
    folder = request.getfixturevalue(fixture)
    one = _generate(folder, 1)
    assert _generate(folder, 2) == one
    assert _generate(folder, 2, ep=True) == one  # --enable-expert-parallel: each rank owns half of the experts


def test_tensor_parallel_decode_graphs_replay_on_every_rank(tp_folder: str) -> None:
    """The graphed decode path under TP: rank 0 prepares each step's packed inputs once, the worker loads them into
    its own bucket's buffers and replays with it (the all-reduces inside meet), and the tokens stay world size 1's."""
    one = _generate(tp_folder, 1)
    assert _generate(tp_folder, 1, graphs=True) == one
    assert _generate(tp_folder, 2, graphs=True) == one


SEQS, BLOCKS = 4, 6


def _v41_opts(folder: str, exact: bool = True) -> dict:
    spec = make_cache_spec(resolve_config(folder)[0], 64, "auto", None, torch.float64)
    slots = 2 * SEQS + 1  # running slots + window checkpoints + the trash slot
    # exact: SWA bounded replay off. Its approximation depends only on rank 0's schedule, which TP does not change, so
    # the default mode must also match world size 1 token for token (the decoder trim then runs on every rank)
    return {"device": "cpu", "dtype": "float64", "block_size": 64, "max_model_len": 256, "max_num_batched_tokens": 96,
            "max_num_seqs": SEQS, "kernels": "reference", "swa_bounded_replay": not exact,
            "kv_cache_memory": slots * spec.slot_bytes() + (BLOCKS + 1) * spec.block_bytes()}


def _generate_v41(folder: str, tp: int, ep: bool = False, exact: bool = True,
                  graphs: bool = False) -> tuple[list[list[int]], dict]:
    extra = dict(graph_stand_ins=True, cuda_graph_sizes=(1, 2, 4)) if graphs else {}
    llm = LLM(folder, tensor_parallel_size=tp, enable_expert_parallel=ep, **_v41_opts(folder, exact), **extra)
    assert llm.engine.capacity.num_blocks == BLOCKS or not exact  # (bounded replay keeps no window checkpoints)
    try:
        g = torch.Generator().manual_seed(2)
        base = torch.randint(0, 129280, (150,), generator=g).tolist()
        others = [torch.randint(0, 129280, (n,), generator=g).tolist() for n in (40, 200, 5, 180, 97)]
        sp = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
        mixed = llm.generate(others, sp)  # more than six blocks' worth: preemptions
        first = llm.generate([base], sp)
        turn = llm.generate([base[:140] + [7, 8, 9]], sp)  # a prefix hit on 128 tokens
        assert turn[0].num_cached_tokens == 128 or not exact
        assert (llm.engine.runner.graphs is not None and llm.engine.runner.graphs.replays > 0) == graphs
        return [o.outputs[0].token_ids for o in mixed + first + turn], llm.engine.stats()
    finally:
        llm.close()


def test_tensor_parallel_engine_runs_v41(tp41_folder: str) -> None:
    one, _ = _generate_v41(tp41_folder, 1)
    two, stats = _generate_v41(tp41_folder, 2)
    assert two == one
    assert stats["preemptions"] > 0 and stats["running"] == 0
    assert _generate_v41(tp41_folder, 2, ep=True)[0] == one
    assert _generate_v41(tp41_folder, 2, exact=False)[0] == _generate_v41(tp41_folder, 1, exact=False)[0]


def test_tensor_parallel_decode_graphs_carry_v41s_engram_history(tp41_folder: str) -> None:
    """V4.1's graphed decode under TP: the Engram n-gram history rank 0's step hook computes travels with the packed
    inputs to the worker's static buffer (a mixed batch with preemptions, then a prefix hit)."""
    assert _generate_v41(tp41_folder, 2, graphs=True)[0] == _generate_v41(tp41_folder, 1)[0]


ON_GPUS = os.environ.get("V4SERVE_TEST_DEVICE", "").startswith("cuda") and torch.cuda.device_count() >= 2


@pytest.mark.skipif(not ON_GPUS, reason="needs V4SERVE_TEST_DEVICE=cuda and two GPUs (NCCL)")
@pytest.mark.parametrize("ep", [False, True])
@pytest.mark.parametrize("fixture", ["tp_folder", "tp41_folder"], ids=["v4-flash", "v41-flash"])
def test_tensor_parallel_engine_on_two_gpus(fixture: str, ep: bool, request: pytest.FixtureRequest,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The same over NCCL on cuda:0 and cuda:1 (float64 reference bodies: exact comparison), eager and with each
    rank's decode CUDA graphs."""
    folder = request.getfixturevalue(fixture)
    monkeypatch.setenv("V4SERVE_MULTI_RANK_GRAPHS", "1")  # (opt-in until this test has passed; workers inherit it)
    runs = []
    for tp, eager in ((1, True), (2, True), (2, False)):  # the last: decode CUDA graphs with NCCL all-reduces inside
        opts = {**OPTS, "device": "cuda", "enforce_eager": eager, "cuda_graph_sizes": (1, 2, 4)}
        llm = LLM(folder, tensor_parallel_size=tp, enable_expert_parallel=ep and tp > 1, **opts)
        try:
            sp = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
            g = torch.Generator().manual_seed(4)
            runs.append([o.outputs[0].token_ids for o in llm.generate(
                [torch.randint(0, 129280, (n,), generator=g).tolist() for n in (150, 40)], sp)])
            assert (llm.engine.runner.graphs is not None and llm.engine.runner.graphs.replays > 0) == (not eager)
        finally:
            llm.close()
    assert runs[0] == runs[1] == runs[2]


@pytest.mark.skipif(not ON_GPUS, reason="needs V4SERVE_TEST_DEVICE=cuda and two GPUs (NCCL, symmetric memory)")
@pytest.mark.parametrize("mode", ["symm", "fused"])
def test_tensor_parallel_all_reduce_modes_on_two_gpus(tp_folder: str, mode: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16 on the Triton kernels with the decode graphs: the one-shot all-reduce, or the sums left to the mHC
    expansion (dist/allreduce.py), against NCCL's. bf16 sums added in another order may part the greedy paths late,
    so the first tokens are compared."""
    monkeypatch.setenv("V4SERVE_MULTI_RANK_GRAPHS", "1")
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 129280, (n,), generator=g).tolist() for n in (150, 40, 9)]
    sp = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    runs = {}
    for m in ("nccl", mode):
        monkeypatch.setenv("V4SERVE_ALLREDUCE", m)  # (the workers inherit it)
        llm = LLM(tp_folder, tensor_parallel_size=2, device="cuda", dtype="bfloat16", kv_cache_memory=64 << 20,
                  max_model_len=512, block_size=64, cuda_graph_sizes=(1, 2, 4))
        try:
            runs[m] = [o.outputs[0].token_ids for o in llm.generate(prompts, sp)]
            assert llm.engine.runner.graphs.replays > 0
        finally:
            llm.close()
    assert sum(a[:3] == b[:3] for a, b in zip(runs["nccl"], runs[mode])) >= 2, runs
