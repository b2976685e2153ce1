"""One tensor-parallel rank of tests/dist/test_tensor_parallel_v41.py (a module of its own: spawned processes import
it), and the V4.1 session both sides run."""

from __future__ import annotations

import torch

from v4serve.cache.pool import KVPools
from v4serve.cache.spec import make_cache_spec
from v4serve.dist.parallel import TensorParallel
from v4serve.models.factory import build_model
from v4serve.models.step import RowSpec, build_step
from v4serve.models.v41.engine_hooks import engram_history

from .common import gloo_rank, state_bytes

BLOCK = 64


def _step(lm, toks: list[int], start: int, history: list[int], blocks: list[int], **row):
    step = build_step([RowSpec(toks, start, 0, blocks, **row)])
    step.engram_prev_ids = engram_history(lm.config, [history], [start], [len(toks)])  # n-grams across chunks
    return step


@torch.no_grad()
def v41_session(lm, toks: list[int], follow: list[int]) -> list[torch.Tensor]:
    """Logits of: a first prefill chunk (every position); a chunk the decoder trim skips entirely (its floor is past
    the chunk: the decoder layers run on no token); a trimmed chunk; then one decode step per token of `follow`."""
    spec = make_cache_spec(lm.config, block_size=BLOCK, kv_dtype="auto", compute_dtype=torch.float64)
    pools = KVPools(spec, num_blocks=8, num_slots=2)
    blocks = list(range(-(-(len(toks) + len(follow)) // BLOCK)))
    a, b = 40, 52
    floor = b + 4
    out = [lm.model(_step(lm, toks[:a], 0, toks, blocks, logits="all"), pools).logits]
    lm.model(_step(lm, toks[a:b], a, toks, blocks, decoder_floor=floor, logits="none"), pools)
    out.append(lm.model(_step(lm, toks[b:], b, toks, blocks, decoder_floor=floor), pools).logits)
    history = list(toks)
    for t in follow:
        history.append(t)
        out.append(lm.model(_step(lm, [t], len(history) - 1, history, blocks), pools).logits)
    return out


def run_rank(rank: int, world: int, port: int, folder: str, toks: list[int], follow: list[int], out: str,
             ep: bool) -> None:
    with gloo_rank(rank, world, port):
        lm = build_model(folder, dtype=torch.float64, with_mtp=False, kernels="reference",
                         tp=TensorParallel(rank, world, expert_parallel=ep))
        result = v41_session(lm, toks, follow)
        held = state_bytes(lm)
        tables = sum(m.weight.numel() for m in lm.model.modules() if hasattr(m, "keeps_stored_format"))
        torch.save({"logits": result, "held": held, "table_rows": tables}, f"{out}.{rank}")
