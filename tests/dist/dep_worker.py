"""One data-parallel rank of tests/dist/test_data_parallel.py (a module of its own: spawned processes import it)."""

from __future__ import annotations

import torch

from v4serve.cache.pool import KVPools
from v4serve.cache.spec import make_cache_spec
from v4serve.dist.parallel import TensorParallel, dep_step
from v4serve.models.factory import build_model
from v4serve.models.step import RowSpec, build_step
from v4serve.models.v4.moe import dep_idle
from v4serve.models.v41.engine_hooks import engram_history

from .common import gloo_rank, state_bytes

BLOCK = 64


def session(lm, toks: list[int], follow: list[int], idle_at: int | None = None, tokens: int = 1):
    """Prefill logits of every position of `toks`, then one decode step per token of `follow`, in a fresh cache.
    With `idle_at`, that decode step is replaced by an idle DEP step (the rank only joins the MoE exchanges)."""
    spec = make_cache_spec(lm.config, block_size=BLOCK, kv_dtype="auto", compute_dtype=torch.float64)
    pools = KVPools(spec, num_blocks=8, num_slots=2)
    blocks = list(range(-(-(len(toks) + len(follow)) // BLOCK)))
    out = [lm.model(build_step([RowSpec(toks, 0, 0, blocks, logits="all")]), pools).logits]
    pos = len(toks)
    history = list(toks)
    for i, t in enumerate(follow):
        if i == idle_at:
            dep_idle(lm.model, tokens)
            continue
        history.append(t)
        step = build_step([RowSpec([t], pos, 0, blocks, logits="last")])
        step.engram_prev_ids = engram_history(lm.config, [history], [pos], [1])  # V4.1's n-gram history
        with dep_step(tokens) if lm.model.layers[0].ffn.tp.data_parallel else _nothing():
            out.append(lm.model(step, pools).logits)
        pos += 1
    return out


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False


def run_dep_rank(rank: int, world: int, port: int, model: str, prompts: list[list[int]], follow: list[int],
                 out: str) -> None:
    """Rank r serves prompts[r]: its prefill (the ranks' token counts differ; no count announced, so the MoE asks
    the ranks), then decode steps; the last rank sits the second decode step out (idle)."""
    with gloo_rank(rank, world, port):
        lm = build_model(model, dtype=torch.float64, with_mtp=False, kernels="reference",
                         tp=TensorParallel(0, 1, expert_parallel=True, dp_rank=rank, dp_size=world))
        logits = session(lm, prompts[rank], follow, idle_at=1 if rank == world - 1 else None)
        held = state_bytes(lm)
        torch.save({"logits": logits, "held": held}, f"{out}.{rank}")
