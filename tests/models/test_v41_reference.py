"""The engine-shaped V4.1 forward against a dense, cache-free re-statement of the architecture (spec §7).

`dense_logits` runs one whole sequence the way the reference code reads: compressed entries by reshaping the
sequence into groups, windows and visibility as dense masks, the candidate blocks by a per-query loop, no pools,
no paging, no compressor state. It shares only the projections with the model, so it checks everything the
engine adds: KV / index sharing through the pools, group bookkeeping, selections carried between layers,
window rings, lagged mHC and the Engram wiring.
"""

from __future__ import annotations

import pytest
import torch

from v4serve.cache.pool import KVPools
from v4serve.cache.spec import make_cache_spec
from v4serve.models.factory import build_model
from v4serve.models.step import RowSpec, build_step
from v4serve.ops.finish import simulate
from v4serve.ops import quant
from v4serve.ops.attention import sparse_attention
from v4serve.ops.indexer import ordered_keys
from v4serve.ops.mhc import hc_collapse, hc_expand
from v4serve.ops.norm import rms_norm
from v4serve.ops.rope import apply_rope, inv_freq, rope_cos_sin


def _candidates(scores: torch.Tensor, visible: torch.Tensor, topk_blocks: int, bs: int) -> torch.Tensor:
    """Per query: block score = max over its visible entries, newest block forced, top blocks kept."""
    S, E = scores.shape
    keep = torch.zeros(S, E, dtype=torch.bool)
    for t in range(S):
        v = int(visible[t])
        if v == 0:
            continue
        nb = -(-v // bs)
        blk = torch.stack([scores[t, b * bs:min((b + 1) * bs, v)].max() for b in range(nb)])
        blk[(v - 1) // bs] = float("inf")
        order = ordered_keys(blk.unsqueeze(0))[0].argsort(descending=True)[:topk_blocks]
        for b in order.tolist():
            keep[t, b * bs:min((b + 1) * bs, v)] = True
    return keep


@torch.no_grad()
def dense_logits(model, toks: list[int]) -> torch.Tensor:
    c, nm = model.config, model.numerics
    S = len(toks)
    ids, pos = torch.tensor(toks), torch.arange(S)
    prev = torch.stack([torch.cat([torch.full((k,), -1), ids[:-k]]) for k in (1, 2, 3)], 1)
    rows = model.engram_hasher().row_ids(ids, prev)
    live = ids != c.image_token_id
    image = ~live
    x = model.embed.weight[ids].to(model.dtype).unsqueeze(1).repeat(1, c.hc_mult, 1)
    pre = torch.zeros(S, c.hc_mult)
    pre[:, 0] = 1
    win = (pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - c.window_size)
    entries, keys, topk, cands = {}, {}, None, None
    for i, blk in enumerate(model.layers):
        if blk.engram is not None:
            x = blk.engram(x, rows[:, blk.engram.index], live)
        att, r = blk.attn, blk.attn.ratio
        pre_a, post, comb = blk.coefficients(x, "attn")
        y = blk.attn_norm(hc_collapse(x, pre))
        cos, sin = rope_cos_sin(pos, inv_freq(c, r > 0))
        q, qr = att.queries(y, cos, sin)
        kv = att.window_kv(y, cos, sin)
        kv_all, mask = kv.unsqueeze(0).expand(S, S, -1), win
        if r:
            if att.compressor is not None:  # a KV source: entries of every complete group of the sequence
                p, n = att.compressor, S // r
                ckv = p.wkv(y.float())[: n * r]
                if r > 1:
                    gate = p.wgate(y.float())[: n * r].view(n, r, -1).softmax(1)
                    ckv = (ckv.view(n, r, -1) * gate).sum(1)
                lat = rms_norm(ckv.to(y.dtype), p.norm.weight, c.norm_eps)
                ecos, esin = rope_cos_sin(torch.arange(n) * r, inv_freq(c, True))
                entries[i] = simulate(apply_rope(lat, ecos, esin), nm.compressed_kv, c.rope_dim)
                k = att.indexer.k_norm(att.indexer.wk(lat.float()).to(y.dtype))
                keys[i] = quant.fp4_simulate(apply_rope(k, ecos, esin), 32)
            src, vis = att.source, (pos + 1) // r
            if att.indexer is not None:  # an index source: score, (candidates,) top-k
                ix, H, D = att.indexer, c.index_n_heads, c.index_head_dim
                ccos, csin = rope_cos_sin(pos, inv_freq(c, True))
                qi = quant.fp4_simulate(apply_rope(ix.wq_b(qr).view(S, H, D), ccos[:, None], csin[:, None]), 32)
                w = ix.weights_proj(y).float() * (D ** -0.5 * H ** -0.5)
                sc = (torch.einsum("shd,ed->she", qi.float(), keys[src].float()).relu() * w[..., None]).sum(1)
                sc = sc.masked_fill(torch.arange(sc.shape[1])[None] >= vis[:, None], float("-inf"))
                if i == c.candidate_source_layer:
                    cands = _candidates(sc, vis, c.candidate_topk_blocks, c.candidate_block_size)
                elif 0 <= c.candidate_source_layer < i:
                    sc = sc.masked_fill(~cands, float("-inf"))
                top = ordered_keys(sc).topk(min(c.index_topk, sc.shape[1]), dim=-1).indices
                ok = torch.gather(sc, 1, top) > float("-inf")
                topk = torch.where(ok, top, torch.full_like(top, -1))
            kv_all = torch.cat([kv_all, entries[src][topk.clamp(min=0)]], 1)
            mask = torch.cat([mask, topk >= 0], 1)
        o = sparse_attention(q, kv_all, mask, att.attn_sink, c.head_dim ** -0.5)
        x = hc_expand(att.output(o, cos, sin), x, post, comb)
        pre_f, post, comb = blk.coefficients(x, "ffn")
        x = hc_expand(blk.ffn(blk.ffn_norm(hc_collapse(x, pre_a)), image), x, post, comb)
        pre = pre_f
    return model.norm(hc_collapse(x, pre)).float() @ model.head.weight.float().t()


@pytest.fixture(scope="module")
def tiny():
    return build_model("tiny-v41-flash", seed=5, with_mtp=False)


def test_engine_forward_matches_dense_reference(tiny):
    c = tiny.config
    toks = torch.randint(0, c.vocab_size, (90,), generator=torch.Generator().manual_seed(7)).tolist()
    toks[40] = c.image_token_id  # an image placeholder: dead for Engram, bias_vl routing
    ref = dense_logits(tiny.model, toks)
    pools = KVPools(make_cache_spec(c, block_size=32), num_blocks=8, num_slots=2)
    with torch.no_grad():
        out = tiny.model(build_step([RowSpec(toks, 0, 1, [5, 2, 7], logits="all")]), pools).logits
    rel = (out - ref).abs().max(-1).values / ref.abs().max(-1).values
    assert rel.max().item() < 1e-4, rel.max().item()
