"""The side-stream overlaps' plumbing in the models (ops/streams.py), on the CPU: with every overlap on and a fork
that runs its branch inline, each overlap forks where the model has the work (V4 and V4.1, prefill and decode), every
fork is joined (a CUDA graph capture fails on a branch left unjoined), and the logits are the plain step's bit for
bit. The streams themselves need a GPU: tests/gpu/test_cuda.py."""

from __future__ import annotations

import pytest
import torch

from v4serve.cache.pool import KVPools
from v4serve.cache.spec import make_cache_spec
from v4serve.models.factory import build_model
from v4serve.models.step import RowSpec, build_step
from v4serve.models.v41.engine_hooks import engram_history
from v4serve.ops import streams


class InlineFork:
    """A fork whose side branch runs inline: it records which overlap forked and how often it was joined."""

    log: list[InlineFork] = []

    def __init__(self, name: str) -> None:
        self.name, self.joined, self.ran = name, 0, False
        InlineFork.log.append(self)

    def run(self, fn):
        self.ran = True
        return fn()

    def join(self) -> None:
        self.joined += 1


def _logits(name: str, tokens: list[int], chunks: list[int]) -> torch.Tensor:
    lm = build_model(name, seed=0, dtype=torch.float64, device="cpu", with_mtp=False)
    pools = KVPools(make_cache_spec(lm.config, 64, "auto", None, torch.float64), 8, 2, "cpu")
    outs, s = [], 0
    with torch.inference_mode():
        for n in chunks:
            step = build_step([RowSpec(tokens[s:s + n], s, 0, list(range(8)), logits="all")], "cpu")
            step.engram_prev_ids = engram_history(lm.config, [tokens], [s], [n], "cpu")
            outs.append(lm.model(step, pools).logits)
            s += n
    return torch.cat(outs)


@pytest.mark.parametrize("name", ["tiny-v4-flash", "tiny-v41-flash"])
def test_every_overlap_forks_and_joins(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    toks = torch.randint(0, 129280, (44,), generator=torch.Generator().manual_seed(3)).tolist()
    chunks = [40, 1, 1, 1, 1]
    monkeypatch.setenv(streams.OVERLAP_ENV, "none")
    plain = _logits(name, toks, chunks)
    monkeypatch.setenv(streams.OVERLAP_ENV, "all")
    monkeypatch.setattr(streams, "fork", lambda n, x, default=None: InlineFork(n) if streams.overlapped(n, default)
                        else None)
    InlineFork.log = []
    assert torch.equal(_logits(name, toks, chunks), plain)
    names = {f.name for f in InlineFork.log}
    assert {"attention_query", "indexer_query", "shared_expert"} <= names, names
    assert all(f.ran and f.joined >= 1 for f in InlineFork.log), [(f.name, f.joined) for f in InlineFork.log]
