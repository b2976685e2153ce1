"""The launch fusions that an A/B run may turn off (ops/backend.fused, V4SERVE_UNFUSE): the switch itself, and the
early store of decode steps' window rows (models/v4/context.py early_window_store), which must give the same logits
as the store after the attention, bit for bit, and skip that store's launch."""

from __future__ import annotations

import pytest
import torch
from helpers import blocks_for, new_pools, preset_model, tokens

from v4serve.models.step import RowSpec, build_step
from v4serve.models.v4.context import StepContext
from v4serve.models.v41.engine_hooks import engram_history
from v4serve.ops import backend


def test_fusion_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(backend.UNFUSE_ENV, raising=False)
    assert all(backend.fused(n) for n in backend.FUSIONS)
    monkeypatch.setenv(backend.UNFUSE_ENV, "norm_quant, early_window")
    assert [backend.fused(n) for n in backend.FUSIONS] == [False, True, False, True]
    monkeypatch.setenv(backend.UNFUSE_ENV, "all")
    assert not any(backend.fused(n) for n in backend.FUSIONS)
    monkeypatch.setenv(backend.UNFUSE_ENV, "norm_quant,typo")
    with pytest.raises(ValueError, match="typo"):
        backend.fused("norm_quant")
    with pytest.raises(ValueError, match="unknown fusion"):
        backend.fused("nothing")


def _decode_logits(preset: str, stores: list[int]) -> torch.Tensor:
    """A 19-token prefill, then 4 one-token decode steps of the same row; the decode steps' logits."""
    lm = preset_model(preset, dtype=torch.float64)
    toks = tokens(23, 5)
    pools = new_pools(lm.config, dtype=torch.float64)
    nb = blocks_for(len(toks))
    outs, s = [], 0
    with torch.no_grad():
        for n in (19, 1, 1, 1, 1):
            step = build_step([RowSpec(toks[s:s + n], s, 0, list(range(nb)), logits="all")])
            step.engram_prev_ids = engram_history(lm.config, [toks], [s], [n], "cpu")
            stores.append(0)
            out = lm.model(step, pools).logits
            if n == 1:
                outs.append(out)
            s += n
    return torch.cat(outs)


@pytest.mark.parametrize("preset", ["tiny-v4-flash", "tiny-v41-flash"])
def test_decode_window_rows_stored_by_their_finish(preset: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Decode steps (one token per row) store their window rows in the KV finish, before the attention reads the ring
    (each row's new slot held a position outside its window): the same logits as storing them after the attention,
    and no write_window launch in those steps; the prefill still stores after its attention."""
    calls: list[int] = []
    real = StepContext.write_window

    def counted(self, *a, **k):
        calls[-1] += 1
        return real(self, *a, **k)

    monkeypatch.setattr(StepContext, "write_window", counted)
    monkeypatch.delenv(backend.UNFUSE_ENV, raising=False)
    early = _decode_logits(preset, calls)
    n_layers = preset_model(preset, dtype=torch.float64).config.n_layers
    assert calls[0] >= n_layers and calls[1:] == [0, 0, 0, 0]
    calls.clear()
    monkeypatch.setenv(backend.UNFUSE_ENV, "early_window")
    late = _decode_logits(preset, calls)
    assert all(c >= n_layers for c in calls)
    assert torch.equal(early, late)
