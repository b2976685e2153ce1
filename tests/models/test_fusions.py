"""The launch fusions (ops/backend.fused, V4SERVE_FUSIONS): the switch itself, and the early store of decode
steps' window rows (models/v4/context.py early_window_store), which must give the same logits as the store after the
attention, bit for bit, and skip that store's launch."""

from __future__ import annotations

import pytest
import torch
from helpers import blocks_for, new_pools, preset_model, tokens

from v4serve.models.step import RowSpec, build_step
from v4serve.models.v4.context import StepContext
from v4serve.models.v41.engine_hooks import engram_history
from v4serve.ops import backend


def test_fusion_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(backend.FUSIONS_ENV, raising=False)
    assert [backend.fused(n) for n in backend.FUSIONS] == [True, False, False, True, False]  # the defaults
    # a small-step fusion: by default on for steps of at most its token count, when the caller says how many
    assert not backend.fused("moe_combine", 1)
    monkeypatch.setattr(backend, "SMALL_STEP_FUSIONS", {"moe_combine": 1})
    assert backend.fused("moe_combine", 1) and not backend.fused("moe_combine", 2) and not backend.fused("moe_combine")
    assert not backend.fused("early_window", 1) and not backend.fused("early_window", 0)  # no limit: never by size
    monkeypatch.setenv(backend.FUSIONS_ENV, "none")
    assert not any(backend.fused(n) for n in backend.FUSIONS)
    assert not backend.fused("moe_combine", 1)  # a set switch list decides alone
    monkeypatch.setenv(backend.FUSIONS_ENV, "")
    assert not any(backend.fused(n) for n in backend.FUSIONS)
    monkeypatch.setenv(backend.FUSIONS_ENV, "norm_quant, early_window")
    assert [backend.fused(n) for n in backend.FUSIONS] == [True, False, True, False, False]
    monkeypatch.setenv(backend.FUSIONS_ENV, "all")
    assert all(backend.fused(n) for n in backend.FUSIONS)
    assert backend.fused("moe_combine", 64)
    monkeypatch.setenv(backend.FUSIONS_ENV, "norm_quant,typo")
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
    monkeypatch.setenv(backend.FUSIONS_ENV, "early_window")
    early = _decode_logits(preset, calls)
    n_layers = preset_model(preset, dtype=torch.float64).config.n_layers
    assert calls[0] >= n_layers and calls[1:] == [0, 0, 0, 0]
    calls.clear()
    monkeypatch.setenv(backend.FUSIONS_ENV, "none")
    late = _decode_logits(preset, calls)
    assert all(c >= n_layers for c in calls)
    assert torch.equal(early, late)


def test_every_fusion_on_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16 on the kernels (the interpreter on the CPU): with every fusion on, the steps take the fused paths (the q
    latent quantized by its norm's launch, the window rows stored by the KV finish, the head weights rounded as
    loaded) and give the unfused steps' logits to bf16 rounding (the norm kernel and the finish kernel may sum a row's
    squares in another order; an FP8 group can then round another way). The tiny preset's wo_a outputs (16 columns a
    group) do not tile wo_b's 32-wide quantization groups, so wo_a stays plain here: tests/ops/test_linear.py covers
    gemv_quant_out at the real shapes."""
    from v4serve.models.factory import build_model
    from v4serve.ops.kernels import fp8_gemv
    from v4serve.ops.kernels import norm as norm_kernel

    lm = build_model("tiny-v4-flash", seed=0, dtype=torch.bfloat16, with_mtp=False, kernels="triton")
    calls = {"norm": 0, "quant_out": 0}
    norm_fp8, run = norm_kernel.rms_norm_fp8, fp8_gemv.run
    monkeypatch.setattr(norm_kernel, "rms_norm_fp8",
                        lambda *a: calls.__setitem__("norm", calls["norm"] + 1) or norm_fp8(*a))
    monkeypatch.setattr(fp8_gemv, "run", lambda *a, **k: calls.__setitem__(
        "quant_out", calls["quant_out"] + bool(k.get("quant_out"))) or run(*a, **k))

    def decode(stores: list[int]) -> torch.Tensor:
        toks = tokens(12, 6)
        pools = new_pools(lm.config, dtype=torch.bfloat16)
        outs, s = [], 0
        with torch.no_grad():
            for n in (10, 1, 1):
                step = build_step([RowSpec(toks[s:s + n], s, 0, [0], logits="all")])
                stores.append(0)
                outs.append(lm.model(step, pools).logits.float())
                s += n
        return torch.cat(outs)

    monkeypatch.setenv(backend.FUSIONS_ENV, "all")
    fused = decode([])
    assert calls["norm"] > 0 and calls["quant_out"] == 0
    calls.update(norm=0, quant_out=0)
    monkeypatch.setenv(backend.FUSIONS_ENV, "none")
    plain = decode([])
    assert calls == {"norm": 0, "quant_out": 0}
    err = ((fused - plain).abs().max() / plain.abs().max()).item()
    assert err < 5e-2, err
    assert torch.equal(fused.argmax(-1), plain.argmax(-1))
