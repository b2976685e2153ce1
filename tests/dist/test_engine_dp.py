"""The engine with --data-parallel-size 2 --enable-expert-parallel (DEP): rank 0 runs one scheduler and KV cache
manager per data-parallel rank, a spawned worker runs rank 1's requests on its own KV pools, and every MoE layer
exchanges tokens between the two over gloo (with --tensor-parallel-size 2: groups of two ranks). Greedy generations equal the single-process engine's through chunked
prefill, decode steps, a prefix-cache hit (the session's turn routed to the rank holding its prefix) and preemptions
(a KV cache of six blocks per rank); a bad layout is refused before any worker starts."""

from __future__ import annotations

import os

import pytest
import torch

from v4serve.cache.spec import make_cache_spec
from v4serve.engine.config import EngineConfigError
from v4serve.engine.llm import LLM
from v4serve.engine.sampling_params import SamplingParams
from v4serve.models.factory import resolve_config

SEQS, BLOCKS = 4, 6


def _opts(model: str) -> dict:
    spec = make_cache_spec(resolve_config(model)[0], 64, "auto", None, torch.float64)
    slots = 2 * SEQS + 1  # running slots + window checkpoints + the trash slot
    # V4.1 in its exact prefix-hit mode: SWA bounded replay is approximate by design, so a request preempted on one
    # layout and not on the other would continue differently
    return dict(device="cpu", dtype="float64", block_size=64, max_model_len=256, max_num_batched_tokens=96,
                max_num_seqs=SEQS, kernels="reference", swa_bounded_replay=False,
                kv_cache_memory=slots * spec.slot_bytes() + (BLOCKS + 1) * spec.block_bytes())


def _generate(model: str, dp: int, graphs: bool = False, tp: int = 1) -> tuple[list[list[int]], list, dict]:
    """graphs: uniform decode steps through every rank's decode graphs (eager stand-ins on the CPU: the same static
    buffers, bucket padding and broadcast inputs, the MoE exchanges padded to the bucket). tp: TP ranks a
    data-parallel group."""
    extra = dict(graph_stand_ins=True, cuda_graph_sizes=(1, 2, 4)) if graphs else {}
    llm = LLM(model, data_parallel_size=dp, tensor_parallel_size=tp, enable_expert_parallel=dp > 1, **_opts(model),
              **extra)
    assert llm.engine.capacity.num_blocks == BLOCKS
    try:
        g = torch.Generator().manual_seed(2)
        base = torch.randint(0, 129280, (150,), generator=g).tolist()
        others = [torch.randint(0, 129280, (n,), generator=g).tolist() for n in (40, 200, 5, 180, 97, 230)]
        sp = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
        # sampling as at world size 1: a seeded request with top logprobs, one with prompt logprobs (every position's
        # logits gathered from its rank)
        seeded = SamplingParams(max_tokens=6, temperature=0.8, seed=11, logprobs=2, ignore_eos=True)
        scored = SamplingParams(max_tokens=3, temperature=0, prompt_logprobs=1, ignore_eos=True)
        params = [sp, seeded, sp, scored, sp, sp]
        mixed = llm.generate(others, params)  # more than six blocks' worth on a rank: preemptions
        first = llm.generate([base], sp)
        turn = llm.generate([base[:140] + [7, 8, 9]], sp)  # the session's next turn: a prefix hit on 128 tokens
        assert turn[0].num_cached_tokens == 128
        outs = [o.outputs[0] for o in mixed + first + turn]
        assert (llm.engine.runner.graphs is not None and llm.engine.runner.graphs.replays > 0) == graphs
        return [o.token_ids for o in outs], outs[1].logprobs + mixed[3].prompt_logprobs, llm.engine.stats()
    finally:
        llm.close()


@pytest.mark.parametrize("model", ["tiny-v4-flash", "tiny-v4-pro", "tiny-v41-flash"])
def test_dep_engine_generates_what_one_process_does(model: str) -> None:
    one, one_lp, _ = _generate(model, 1)
    two, two_lp, stats = _generate(model, 2)
    assert two == one
    assert len(one_lp) == len(two_lp) == 6 + 180
    for a, b in zip(one_lp, two_lp):  # the same tokens scored, to rounding
        assert (a is None) == (b is None)
        if a is not None:
            assert a.keys() == b.keys() and all(abs(a[k] - b[k]) <= 1e-6 * max(1.0, abs(a[k])) for k in a)
    assert stats["preemptions"] > 0  # a rank ran out of its six blocks and recomputed
    assert all(r["running"] == 0 for r in stats["dp_ranks"])
    assert sum(r["prefix_hits"] for r in stats["dp_ranks"]) >= 1


@pytest.mark.parametrize("model", ["tiny-v4-flash", "tiny-v41-flash"])
def test_dep_decode_graphs_replay_on_every_rank(model: str) -> None:
    """DEP's graphed decode: rank 0 prepares every rank's inputs for one bucket (an idle rank's are padding only),
    each rank replays its own graph, whose MoE exchanges are padded to the bucket; the tokens stay world size 1's
    (V4.1: the Engram history travels with the inputs)."""
    assert _generate(model, 2, graphs=True)[0] == _generate(model, 1)[0]


@pytest.mark.parametrize("fixture", ["tp_folder", "tp41_folder"], ids=["v4-flash", "v41-flash"])
def test_dep_with_tensor_parallel_groups(fixture: str, request: pytest.FixtureRequest) -> None:
    """-dp 2 -tp 2 --enable-expert-parallel: two data-parallel groups of two TP ranks (4 processes; heads, wo_a
    groups, the shared expert and the vocabulary split inside a group, the 8 experts over all 4 ranks; the tiny
    checkpoints whose row-parallel inputs split on whole activation blocks, conftest.py), the MoE's exchange over each
    TP rank's peers in the other group then summed in the group: world size 1's tokens, eagerly and through the
    decode graphs' stand-ins."""
    model = request.getfixturevalue(fixture)
    one = _generate(model, 1)[0]
    assert _generate(model, 2, tp=2)[0] == one
    assert _generate(model, 2, graphs=True, tp=2)[0] == one


def test_bad_dep_layouts_are_refused(capsys: pytest.CaptureFixture) -> None:
    from v4serve.cli import main

    assert main(["serve", "tiny-v4-flash", "-dp", "2"]) == 2
    assert "--enable-expert-parallel" in capsys.readouterr().err
    with pytest.raises(EngineConfigError, match="enable-expert-parallel"):
        LLM("tiny-v4-flash", device="cpu", data_parallel_size=2)
    with pytest.raises(EngineConfigError, match="4 attention heads"):  # TP 3 inside each group: before any worker
        LLM("tiny-v4-flash", device="cpu", data_parallel_size=2, tensor_parallel_size=3, enable_expert_parallel=True)
    with pytest.raises(EngineConfigError, match="8 routed experts over 3 ranks"):
        LLM("tiny-v4-flash", device="cpu", data_parallel_size=3, enable_expert_parallel=True)


def test_sessions_stick_to_their_rank_and_new_ones_go_to_the_less_loaded() -> None:
    llm = LLM("tiny-v4-flash", data_parallel_size=2, enable_expert_parallel=True, **_opts("tiny-v4-flash"))
    engine = llm.engine
    try:
        g = torch.Generator().manual_seed(3)
        a, b, c, d = (torch.randint(0, 129280, (n,), generator=g).tolist() for n in (140, 60, 150, 30))
        sp = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
        first = llm.generate([a, b], sp)  # both idle: a to rank 0, b to the less-loaded rank 1
        ranks = {}
        for name, prompt in (("c", c), ("a2", a + first[0].outputs[0].token_ids + [5] * 20), ("d", d)):
            rid = engine.add_request(prompt, sp, request_id=name)[0]
            ranks[name] = engine.requests[rid].dp_rank
        # c: a new session while both ranks are idle -> rank 0; a2: session a's next turn -> a's rank 0 although
        # rank 0 is now the busier; d: a new session -> the less-loaded rank 1
        assert ranks == {"c": 0, "a2": 0, "d": 1}
        done = {}
        while engine.has_unfinished():
            for delta in engine.step():
                if delta.finished:
                    done[delta.request_id] = engine.requests[delta.request_id]
        assert done["a2"].num_cached_tokens == 128  # a's blocks (and window checkpoint) were on rank 0
        stats = engine.stats()
        assert stats["dp_routed_by_prefix"] == 1 and stats["dp_routed_by_load"] == 4
    finally:
        llm.close()


ON_GPUS = os.environ.get("V4SERVE_TEST_DEVICE", "").startswith("cuda") and torch.cuda.device_count() >= 2


@pytest.mark.skipif(not ON_GPUS, reason="needs V4SERVE_TEST_DEVICE=cuda and two GPUs (NCCL)")
def test_dep_engine_on_two_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same over NCCL on cuda:0 and cuda:1 (float64 reference bodies: exact comparison), eager and with each
    rank's decode CUDA graphs (the MoE exchanges captured inside)."""
    monkeypatch.setenv("V4SERVE_MULTI_RANK_GRAPHS", "1")  # (opt-in until this test has passed; workers inherit it)
    runs = []
    for dp, eager in ((1, True), (2, True), (2, False)):
        llm = LLM("tiny-v4-flash", data_parallel_size=dp, enable_expert_parallel=dp > 1,
                  **{**_opts("tiny-v4-flash"), "device": "cuda", "kv_cache_memory": 64 << 20,
                     "enforce_eager": eager, "cuda_graph_sizes": (1, 2, 4)})
        try:
            sp = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
            g = torch.Generator().manual_seed(4)
            runs.append([o.outputs[0].token_ids for o in llm.generate(
                [torch.randint(0, 129280, (n,), generator=g).tolist() for n in (150, 40, 97)], sp)])
            assert (llm.engine.runner.graphs is not None and llm.engine.runner.graphs.replays > 0) == (not eager)
        finally:
            llm.close()
    assert runs[0] == runs[1] == runs[2]


ON_FOUR_GPUS = ON_GPUS and torch.cuda.device_count() >= 4


@pytest.mark.skipif(not ON_FOUR_GPUS, reason="needs V4SERVE_TEST_DEVICE=cuda and four GPUs (NCCL)")
def test_dep_with_tensor_parallel_groups_on_four_gpus(tp_folder: str) -> None:
    """-dp 2 -tp 2 over NCCL on cuda:0..3 (float64 reference bodies: exact comparison with one GPU), eagerly."""
    runs = []
    for dp, tp in ((1, 1), (2, 2)):
        llm = LLM(tp_folder, data_parallel_size=dp, tensor_parallel_size=tp, enable_expert_parallel=dp > 1,
                  **{**_opts(tp_folder), "device": "cuda", "kv_cache_memory": 64 << 20, "enforce_eager": True})
        try:
            sp = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
            g = torch.Generator().manual_seed(4)
            runs.append([o.outputs[0].token_ids for o in llm.generate(
                [torch.randint(0, 129280, (n,), generator=g).tolist() for n in (150, 40, 97)], sp)])
        finally:
            llm.close()
    assert runs[0] == runs[1]
