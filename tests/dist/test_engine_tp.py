"""The engine with --tensor-parallel-size 2: rank 0 schedules and samples, a spawned worker process runs the other
half of the model on its own KV pools, over gloo. Greedy generations equal the single-process engine's, through
prefill chunks, decode steps and a prefix-cache hit (slot operations replayed on the worker)."""

from __future__ import annotations

import os

import pytest
import torch

from v4serve.engine.llm import LLM
from v4serve.engine.sampling_params import SamplingParams

OPTS = dict(device="cpu", dtype="float64", kv_cache_memory=64 << 20, max_model_len=512, block_size=64,
            max_num_batched_tokens=96, kernels="reference")


def _generate(folder: str, tp: int, ep: bool = False) -> list[list[int]]:
    llm = LLM(folder, tensor_parallel_size=tp, enable_expert_parallel=ep, **OPTS)
    assert (llm.engine.peers is not None and llm.engine.peers.size == 2) == (tp == 2)
    try:
        g = torch.Generator().manual_seed(2)
        base = torch.randint(0, 129280, (150,), generator=g).tolist()
        prompts = [base, base[:140] + [7, 8, 9], torch.randint(0, 129280, (40,), generator=g).tolist()]
        sp = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
        first = llm.generate(prompts[:1], sp)  # then a prefix hit on the first 128 tokens (a window checkpoint copied)
        rest = llm.generate(prompts[1:], sp)
        assert rest[0].num_cached_tokens == 128
        return [o.outputs[0].token_ids for o in first + rest]
    finally:
        llm.close()


def test_tensor_parallel_engine_generates_what_one_process_does(tp_folder: str) -> None:
    one = _generate(tp_folder, 1)
    assert _generate(tp_folder, 2) == one
    assert _generate(tp_folder, 2, ep=True) == one  # --enable-expert-parallel: each rank owns half of the experts


ON_GPUS = os.environ.get("V4SERVE_TEST_DEVICE", "").startswith("cuda") and torch.cuda.device_count() >= 2


@pytest.mark.skipif(not ON_GPUS, reason="needs V4SERVE_TEST_DEVICE=cuda and two GPUs (NCCL)")
@pytest.mark.parametrize("ep", [False, True])
def test_tensor_parallel_engine_on_two_gpus(tp_folder: str, ep: bool) -> None:
    """The same over NCCL on cuda:0 and cuda:1 (float64 reference bodies: exact comparison)."""
    opts = {**OPTS, "device": "cuda"}
    runs = []
    for tp in (1, 2):
        llm = LLM(tp_folder, tensor_parallel_size=tp, enable_expert_parallel=ep and tp > 1, **opts)
        try:
            sp = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
            g = torch.Generator().manual_seed(4)
            runs.append([o.outputs[0].token_ids for o in llm.generate(
                [torch.randint(0, 129280, (n,), generator=g).tolist() for n in (150, 40)], sp)])
        finally:
            llm.close()
    assert runs[0] == runs[1]
