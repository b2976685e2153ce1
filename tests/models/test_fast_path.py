"""The whole model on the fast path (the Triton kernels: dense FP8 GEMMs, FP4 MoE, fused router) against the same
model on the plain-torch reference bodies, and the model-level exactness properties with the fast path on.

On the CPU the kernels run under Triton's interpreter in float64 (the kernels take fp64 dots there), so the fast path
must reproduce the reference to float64 rounding — which, through the discontinuous FP8/FP4 simulations and the
indexer's top-k, means the same logits to ~1e-12 — and chunked prefill and multi-row steps must equal one-shot
single-row runs, exactly as on the reference path. (On a GPU the same model runs in bf16: tests/gpu/test_cuda.py.)
"""

from __future__ import annotations

import functools

import pytest
import torch
from helpers import blocks_for, max_rel_err, new_pools, one_shot, tokens

from v4serve.models.factory import build_model
from v4serve.models.step import RowSpec, build_step
from v4serve.models.v41.engine_hooks import engram_history

EXACT = torch.float64
N = 56


@functools.cache
def fast_model(preset: str):
    return build_model(preset, seed=0, dtype=EXACT, with_mtp=False, kernels="triton")


@functools.cache
def reference_model(preset: str):
    return build_model(preset, seed=0, dtype=EXACT, with_mtp=False, kernels="reference")


@pytest.fixture(scope="module")
def one_shots():
    cache: dict[str, torch.Tensor] = {}

    def get(preset: str) -> torch.Tensor:
        if preset not in cache:
            cache[preset] = one_shot(fast_model(preset), tokens(N, 3))
        return cache[preset]

    return get


@pytest.mark.parametrize("preset", ["tiny-v4-flash", "tiny-v41-flash"])
def test_fast_path_equals_reference_bodies(one_shots, preset: str) -> None:
    lm = fast_model(preset)
    for mod in (lm.model.layers[0].attn.wq_a, lm.model.layers[0].ffn):
        assert mod.backend == "triton"
    ref = one_shot(reference_model(preset), tokens(N, 3))
    assert max_rel_err(one_shots(preset), ref) < 1e-9


@pytest.mark.parametrize("preset", ["tiny-v4-flash", "tiny-v41-flash"])
def test_chunked_prefill_equals_one_shot_on_the_fast_path(one_shots, preset: str) -> None:
    lm, toks = fast_model(preset), tokens(N, 3)
    pools = new_pools(lm.config, dtype=EXACT)
    outs, s = [], 0
    with torch.no_grad():
        for n in (19, 1, 36):
            step = build_step([RowSpec(toks[s:s + n], s, 0, list(range(blocks_for(N))), logits="all")])
            step.engram_prev_ids = engram_history(lm.config, [toks], [s], [n], "cpu")
            outs.append(lm.model(step, pools).logits)
            s += n
    assert max_rel_err(torch.cat(outs), one_shots(preset)) < 1e-9


def test_two_rows_in_one_step_equal_each_alone_on_the_fast_path(one_shots) -> None:
    preset = "tiny-v4-flash"
    lm = fast_model(preset)
    a, b = tokens(N, 3), tokens(23, 4)
    pools = new_pools(lm.config, dtype=EXACT)
    nb = blocks_for(N)
    step = build_step([RowSpec(a, 0, 0, list(range(nb)), logits="all"),
                       RowSpec(b, 0, 1, list(range(nb, 2 * nb)), logits="all")])
    with torch.no_grad():
        both = lm.model(step, pools).logits
    assert max_rel_err(both[:N], one_shots(preset)) < 1e-9
    assert max_rel_err(both[N:], one_shot(lm, b)) < 1e-9



@pytest.mark.parametrize("preset,kv", [("tiny-v4-flash", "fp8"), ("tiny-v41-flash", "fp4")])
def test_stored_records_staged_for_prompt_chunks_give_the_same_logits(preset: str, kv: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Prompt chunks over stored records (V4's FP8, V4.1's NVFP4 entries and FP8 window rows) decode them once into
    staging rows (ops/kernels/attention_stage.py): the chunked prefill's logits are the bits of the same chunks with
    the records decoded in registers, and the decode row after them too. Decode launches' CSA picks are staged by
    default over V4.1's NVFP4 entries (not V4's records: V4SERVE_ATTN_STAGE=picks), the same bits again; the layers
    that read one KV source with the same picks stage those entries once (StepContext.entry_refs)."""
    from v4serve.ops.kernels import attention_stage

    lm, toks = fast_model(preset), tokens(32, 3)
    staged_launches, picks_launches, entry_launches = [], [], []
    stage, stage_picks, stage_entries = attention_stage.stage, attention_stage.stage_picks, \
        attention_stage._stage_entries
    monkeypatch.setattr(attention_stage, "stage", lambda *a: staged_launches.append(1) or stage(*a))
    monkeypatch.setattr(attention_stage, "stage_picks", lambda *a: picks_launches.append(1) or stage_picks(*a))
    monkeypatch.setattr(attention_stage, "_stage_entries", lambda *a: entry_launches.append(1) or stage_entries(*a))

    def run() -> torch.Tensor:
        pools = new_pools(lm.config, kv_dtype=kv, dtype=EXACT)
        outs, s = [], 0
        with torch.no_grad():
            for n in (20, 11, 1):
                step = build_step([RowSpec(toks[s:s + n], s, 0, list(range(blocks_for(32))), logits="all")])
                step.engram_prev_ids = engram_history(lm.config, [toks], [s], [n], "cpu")
                outs.append(lm.model(step, pools).logits)
                s += n
        return torch.cat(outs)

    staged = run()
    assert staged_launches  # the prompt chunks took the staging
    assert bool(picks_launches) == (kv == "fp4")  # and V4.1's decode picks (the 11-token chunk and the decode row)
    if kv == "fp4":  # fewer entry stagings than staged layers: shared KV sources and picks staged once a step
        assert 0 < len(entry_launches) < len(picks_launches), (len(entry_launches), len(picks_launches))
    for env, prompt, picks in (("0", False, False), ("prompt", True, False), ("picks", True, True)):
        staged_launches.clear()
        picks_launches.clear()
        monkeypatch.setenv("V4SERVE_ATTN_STAGE", env)
        assert torch.equal(run(), staged)
        assert bool(staged_launches) == prompt and bool(picks_launches) == picks, env
