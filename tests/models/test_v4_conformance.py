"""Conformance with transformers' DeepseekV4ForCausalLM (transformers==5.17.0) on the same float32 checkpoint.

`numerics="transformers"` must reproduce transformers to float32 rounding, for a 300-token prompt (many 16-token
windows, CSA groups of 4 and HCA groups of 8) and for 32 greedy decode steps through our paged cache against
transformers' own cached decode. The default `numerics="deepseek"` follows DeepSeek's reference instead: it must
differ measurably (its QAT simulations are on) while staying the same model.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers import (
    PRESETS,
    blocks_for,
    checkpoint,
    ckpt_root,  # noqa: F401  (fixture)
    folder_model,
    hf_model,
    max_rel_err,
    new_pools,
    one_shot,
    rel_err,
    tokens,
)

from v4serve.models.factory import model_class
from v4serve.models.loading import apply_numerics, load_random
from v4serve.models.numerics import numerics_for
from v4serve.models.step import RowSpec, build_step
from v4serve.presets import get_preset

pytest.importorskip("transformers")

TOL = 1e-4
N_PROMPT = 300
N_DECODE = 32


@pytest.fixture(scope="module")
def runs(ckpt_root):  # noqa: F811
    """Per preset: transformers' prompt logits and cached greedy decode, and ours through the paged cache."""
    cache: dict[str, dict] = {}

    def get(preset: str) -> dict:
        if preset in cache:
            return cache[preset]
        folder = str(checkpoint(ckpt_root, preset, 1, "float32"))
        hf = hf_model(folder)
        # The indexer's top-k can meet exact ties (several entries scoring 0.0 when every head's ReLU is 0);
        # v4serve breaks them toward the lower entry, transformers' torch.topk in its own order. Both are valid
        # selections but give different logits, so the prompt is one whose run meets no tie at the top-k edge
        # (prompt seed 100 meets one in tiny-v4-pro's decode at position 323).
        toks = tokens(N_PROMPT, 103)
        with torch.no_grad():
            o = hf(torch.tensor([toks]), use_cache=True)
            ref_prompt, pkv = o.logits[0], o.past_key_values
            ref_toks, ref_dec = [], []
            tok = int(ref_prompt[-1].argmax())
            for _ in range(N_DECODE):
                ref_toks.append(tok)
                o = hf(torch.tensor([[tok]]), past_key_values=pkv, use_cache=True)
                pkv = o.past_key_values
                ref_dec.append(o.logits[0, -1])
                tok = int(ref_dec[-1].argmax())

            lm = folder_model(folder, "transformers")
            pools = new_pools(lm.config)
            blocks = list(range(blocks_for(N_PROMPT + N_DECODE)))
            ours_prompt = lm.model(build_step([RowSpec(toks, 0, 1, blocks, logits="all")]), pools).logits
            our_toks, our_dec = [], []
            tok = int(ours_prompt[-1].argmax())
            for i in range(N_DECODE):
                our_toks.append(tok)
                step = build_step([RowSpec([tok], N_PROMPT + i, 1, blocks)])
                our_dec.append(lm.model(step, pools).logits[0])
                tok = int(our_dec[-1].argmax())
        cache[preset] = {"folder": folder, "toks": toks, "ref_prompt": ref_prompt, "ref_toks": ref_toks,
                         "ref_dec": torch.stack(ref_dec), "ours_prompt": ours_prompt, "our_toks": our_toks,
                         "our_dec": torch.stack(our_dec)}
        return cache[preset]

    return get


@pytest.mark.parametrize("preset", PRESETS)
def test_prompt_logits_match_transformers(runs, preset):
    r = runs(preset)
    assert r["ours_prompt"].shape == (N_PROMPT, get_preset(preset).vocab_size)
    err = rel_err(r["ours_prompt"], r["ref_prompt"])
    assert err.max().item() <= TOL, f"position {int(err.argmax())}: rel err {err.max():.3g}"


@pytest.mark.parametrize("preset", PRESETS)
def test_greedy_decode_matches_transformers_cached_decode(runs, preset):
    r = runs(preset)
    assert r["our_toks"] == r["ref_toks"]
    err = rel_err(r["our_dec"], r["ref_dec"])
    assert err.max().item() <= TOL, f"decode step {int(err.argmax())}: rel err {err.max():.3g}"


@pytest.mark.parametrize("preset", PRESETS)
def test_deepseek_numerics_differ_measurably_from_transformers(runs, preset):
    r = runs(preset)
    ours = one_shot(folder_model(r["folder"], "deepseek"), r["toks"])
    assert torch.isfinite(ours).all()
    # far beyond float rounding (the transformers-numerics run above agrees to ~1e-6)
    assert max_rel_err(ours, r["ref_prompt"]) > 1e-2


def test_deepseek_numerics_keep_most_greedy_tokens(ckpt_root):  # noqa: F811
    """With the released SwiGLU limit (10: the shared-expert clamp, which the reference does not apply, then
    rarely bites) the remaining differences are the QAT simulations: measurable, yet most next-token argmaxes
    agree with transformers and nearly all fall in its top 5. (The tiny presets' limit of 1 clips the shared
    expert hard, so there the clamp difference alone changes most argmaxes.)"""
    folder = str(checkpoint(ckpt_root, "tiny-v4-flash", 2, "float32", swiglu_limit=10.0))
    toks = tokens(N_PROMPT, 101)
    with torch.no_grad():
        ref = hf_model(folder)(torch.tensor([toks])).logits[0]
    ours = one_shot(folder_model(folder, "deepseek"), toks)
    assert max_rel_err(ours, ref) > 1e-2
    assert rel_err(ours, ref).median().item() > 1e-3
    agree = (ours.argmax(-1) == ref.argmax(-1)).float().mean().item()
    top5 = (ref.topk(5, -1).indices == ours.argmax(-1, keepdim=True)).any(-1).float().mean().item()
    assert agree >= 0.6, agree
    assert top5 >= 0.85, top5
    cos = torch.nn.functional.cosine_similarity(ours, ref, dim=-1)
    assert cos.mean().item() >= 0.95


def _build(preset: str, numerics, seed: int = 0):
    """A fp8-stored preset model with explicit (possibly ablated) numerics."""
    config = get_preset(preset)
    net = model_class(config)(config, numerics, with_mtp=False)
    load_random(net, config, seed, "fp8", torch.float32, torch.device("cpu"), include_mtp=False)
    apply_numerics(net, numerics, config)
    return net.eval()


def test_each_reference_simulation_is_active():
    """Switching any one of DeepSeek's simulations off (to transformers' behaviour) changes the logits, so none
    of them can be silently disabled in the default numerics."""
    preset = "tiny-v4-flash"
    config = get_preset(preset)
    ds, tr = numerics_for(config, "deepseek"), numerics_for(config, "transformers")
    assert ds.mode == "deepseek" and ds.window_kv == "v4_fp8" and ds.compressed_kv == "v4_fp8"
    assert ds.index_rotate and ds.index_fp4 and ds.act_quant and not ds.shared_clamp
    toks = tokens(100, 102)
    step_rows = [RowSpec(toks, 0, 0, list(range(blocks_for(len(toks)))), logits="all")]

    def logits(nm) -> torch.Tensor:
        with torch.no_grad():
            return _build(preset, nm)(build_step(step_rows), new_pools(config)).logits

    base = logits(ds)
    # the fp8-stored model under deepseek numerics quantizes the activations of its quantized GEMMs
    net = _build(preset, ds)
    assert net.layers[0].attn.wq_a.act_group == config.weight_block
    assert net.layers[0].attn.wo_a.act_group == 0  # the reference's wo_a is a BF16 einsum
    for field in ("window_kv", "compressed_kv", "index_rotate", "index_fp4", "shared_clamp", "act_quant"):
        off = dataclasses.replace(ds, **{field: getattr(tr, field)})
        assert max_rel_err(logits(off), base) > 1e-3, f"turning {field} off changed nothing"
