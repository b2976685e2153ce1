"""One tensor-parallel rank of tests/dist/test_tensor_parallel.py (a module of its own: spawned processes import it)."""

from __future__ import annotations

import torch

from v4serve.cache.pool import KVPools
from v4serve.cache.spec import make_cache_spec
from v4serve.dist.parallel import TensorParallel
from v4serve.models.factory import build_model
from v4serve.models.step import RowSpec, build_step

from .common import gloo_rank, state_bytes

BLOCK = 64


@torch.no_grad()
def logits_of(lm, toks: list[int], next_token: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill logits of every position, then the logits of one decode step after it, in a fresh cache."""
    spec = make_cache_spec(lm.config, block_size=BLOCK, kv_dtype="auto", compute_dtype=torch.float64)
    pools = KVPools(spec, num_blocks=8, num_slots=2)
    blocks = list(range(-(-(len(toks) + 1) // BLOCK)))
    prefill = lm.model(build_step([RowSpec(toks, 0, 0, blocks, logits="all")]), pools).logits
    decode = lm.model(build_step([RowSpec([next_token], len(toks), 0, blocks, logits="last")]), pools).logits
    return prefill, decode


def run_rank(rank: int, world: int, port: int, folder: str, toks: list[int], out: str, ep: bool = False) -> None:
    with gloo_rank(rank, world, port):
        lm = build_model(folder, dtype=torch.float64, with_mtp=False, kernels="reference",
                         tp=TensorParallel(rank, world, expert_parallel=ep))
        result = logits_of(lm, toks, toks[0])
        held = state_bytes(lm)
        torch.save({"logits": result, "held": held}, f"{out}.{rank}")
