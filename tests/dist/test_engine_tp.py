"""The engine with --tensor-parallel-size 2: rank 0 schedules and samples, a spawned worker process runs the other
half of the model on its own KV pools, over gloo. Greedy generations equal the single-process engine's, through
prefill chunks, decode steps and a prefix-cache hit (slot operations replayed on the worker)."""

from __future__ import annotations

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
