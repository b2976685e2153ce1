"""DeepSeek-V4.1 engine-shaped forward on tiny-v41-flash: chunking, decode, sharing, selection, bounded replay,
DSpark drafting."""

from __future__ import annotations

import contextlib

import pytest
import torch

from v4serve.cache.pool import KVPools
from v4serve.cache.spec import make_cache_spec
from v4serve.models.factory import build_model
from v4serve.models.step import RowSpec, build_step
from v4serve.models.v41.attention import V41Attention
from v4serve.models.v41.engine_hooks import engram_history
from v4serve.models.v41.indexer import candidate_mask


@pytest.fixture(scope="module")
def tiny():
    # float64: steps that batch rows differently run GEMMs of different shapes whose float32 rounding differs in
    # the last ulp; the FP8 activation / FP4 index-query simulations can amplify such an ulp into another
    # quantization step (and another top-k pick). In float64 that never reaches float32's rounding.
    return build_model("tiny-v41-flash", seed=0, dtype=torch.float64)


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, 129280, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _pools(tiny, slots: int = 4) -> KVPools:
    return KVPools(make_cache_spec(tiny.config, block_size=32, with_mtp=True, compute_dtype=torch.float64), num_blocks=24, num_slots=slots)


def _run(tiny, pools, rows: list[RowSpec], histories: list[list[int]], decoder_trim: bool | None = None):
    """One step of rows (each with its request's token history for Engram's look-back)."""
    step = build_step(rows)
    step.engram_prev_ids = engram_history(tiny.config, histories, [r.start for r in rows],
                                          [len(r.token_ids) for r in rows])
    step.decoder_trim = decoder_trim
    with torch.no_grad():
        return tiny.model(step, pools)


def _prefill(tiny, pools, toks, slot, blocks, cuts, floor=0, logits="last"):
    """Prefill `toks` in chunks of the given sizes; returns the concatenated logits of the chunks."""
    out, s = [], 0
    for n in cuts:
        row = RowSpec(toks[s:s + n], s, slot, blocks, decoder_floor=floor,
                      logits=logits if s + n == len(toks) or logits == "all" else "none")
        out.append(_run(tiny, pools, [row], [toks]).logits)
        s += n
    return torch.cat(out)


# --- exactness of the engine shape ------------------------------------------------------------------------
def test_chunked_prefill_equals_one_shot(tiny):
    """Two requests in one multi-row step, chunked at random boundaries, equal their one-shot prefills."""
    a, b = _tokens(96, 1), _tokens(70, 2)
    ref_pools = _pools(tiny)
    ref_a = _prefill(tiny, ref_pools, a, 0, [0, 1, 2], [96], logits="all")
    ref_b = _prefill(tiny, ref_pools, b, 1, [3, 4, 5], [70], logits="all")
    pools = _pools(tiny)
    g = torch.Generator().manual_seed(0)
    sa = sb = 0
    got_a, got_b = [], []
    while sa < 96 or sb < 70:
        na = min(96 - sa, int(torch.randint(0, 23, (1,), generator=g)))
        nb = min(70 - sb, int(torch.randint(0, 19, (1,), generator=g)))
        rows = [RowSpec(a[sa:sa + na], sa, 2, [6, 7, 8], logits="all"),
                RowSpec(b[sb:sb + nb], sb, 3, [9, 10, 11], logits="all")]
        lg = _run(tiny, pools, rows, [a, b]).logits
        got_a.append(lg[:na])
        got_b.append(lg[na:])
        sa, sb = sa + na, sb + nb
    assert (torch.cat(got_a) - ref_a).abs().max() < 1e-4
    assert (torch.cat(got_b) - ref_b).abs().max() < 1e-4


def test_decode_after_prefill_equals_full_recompute(tiny):
    a, b = _tokens(90, 3), _tokens(75, 4)
    full_a = _prefill(tiny, _pools(tiny), a, 0, [0, 1, 2], [90], logits="all")
    full_b = _prefill(tiny, _pools(tiny), b, 0, [0, 1, 2], [75], logits="all")
    pools = _pools(tiny)
    _prefill(tiny, pools, a, 0, [0, 1, 2], [60])
    _prefill(tiny, pools, b, 1, [3, 4, 5], [33, 12])
    for i in range(30):  # batched decode of both rows (b finishes its prompt first, then decodes too)
        pa, pb = 60 + i, 45 + i
        rows = [RowSpec([a[pa]], pa, 0, [0, 1, 2])]
        if pb < 75:
            rows.append(RowSpec([b[pb]], pb, 1, [3, 4, 5]))
        lg = _run(tiny, pools, rows, [a, b][:len(rows)]).logits
        assert (lg[0] - full_a[pa]).abs().max() < 1e-4
        if pb < 75:
            assert (lg[1] - full_b[pb]).abs().max() < 1e-4


def test_tiled_gathers_equal_untiled(tiny, monkeypatch):
    """Token chunks of the gathers and token chunks / entry tiles of the index scores do not change the result."""
    from v4serve.ops import attention, indexer

    toks = _tokens(70, 11)
    whole = _prefill(tiny, _pools(tiny), toks, 0, [0, 1, 2], [70], logits="all")
    monkeypatch.setattr(attention, "TOKEN_CHUNK", 9)  # the reference attention's gathers
    monkeypatch.setattr(indexer, "TOKEN_CHUNK", 9)
    monkeypatch.setattr(indexer, "ENTRY_CHUNK", 5)
    tiled = _prefill(tiny, _pools(tiny), toks, 0, [0, 1, 2], [70], logits="all")
    assert (tiled - whole).abs().max() < 1e-6


def test_quantized_cache_records_are_lossless(tiny):
    """The 890 B/token formats (FP8-per-32 window, NVFP4 entries, MXFP4 index keys) store V4.1's simulated values
    exactly, and so does BF16."""
    toks = _tokens(60, 12)
    got = {}
    for kv in ("auto", "fp4", "bf16"):
        pools = KVPools(make_cache_spec(tiny.config, block_size=32, kv_dtype=kv, compute_dtype=torch.float64), num_blocks=8, num_slots=1)
        got[kv] = _prefill(tiny, pools, toks, 0, [0, 1], [35, 25], logits="all")
    assert torch.equal(got["fp4"], got["auto"]) and torch.equal(got["bf16"], got["auto"])


# --- sharing and selection ---------------------------------------------------------------------------------
@contextlib.contextmanager
def _record_selection():
    """Record, per layer with a compressed branch, its selection and the compressed KV rows it attends."""
    seen: dict[int, dict] = {}
    orig = V41Attention.entries

    def wrapped(self, ctx, sel):
        refs = orig(self, ctx, sel)
        rows, valid = refs.where.token_rows(refs.where.token_row, refs.picks.clamp(min=0)), refs.picks >= 0
        vis, c = ctx.visible(self.ratio), self.config
        seen[self.layer] = {"topk": sel.topk.clone(), "valid": valid, "source": self.source,
                            "kv": ctx.pools.compressed[self.source].read(rows, torch.float32),
                            "candidates": None if sel.blocks is None else candidate_mask(
                                sel.blocks, ctx.max_entries(self.ratio), c.candidate_block_size, vis),
                            "visible": vis}
        return refs

    V41Attention.entries = wrapped
    try:
        yield seen
    finally:
        V41Attention.entries = orig


def _recorded_prefill(tiny, n: int = 100):
    toks = _tokens(n, 5)
    pools = _pools(tiny)
    with _record_selection() as seen:
        _run(tiny, pools, [RowSpec(toks, 0, 0, [0, 1, 2, 3])], [toks])
    return seen, pools


def test_kv_sharing_and_index_reuse(tiny):
    c = tiny.config
    seen, pools = _recorded_prefill(tiny)
    assert set(pools.compressed) == set(pools.index_keys) == set(c.kv_source_layers)
    assert set(pools.state) == {s for s in c.kv_source_layers if c.compress_ratios[s] > 1}
    compressed = [i for i in range(c.n_layers) if c.compress_ratios[i]]
    assert sorted(seen) == compressed
    for layer in compressed:
        rec, src = seen[layer], seen[c.index_source(layer)]
        assert rec["source"] == c.kv_source(layer)
        # index readers reuse their index source's selection
        assert torch.equal(rec["topk"], src["topk"])
        # layers sharing a KV source read the same entries (same rows, same values) as the source itself
        kv_src = seen[c.kv_source(layer)]
        if torch.equal(rec["topk"], kv_src["topk"]):
            assert torch.equal(rec["kv"], kv_src["kv"])
    for group in {c.kv_source(i) for i in compressed}:
        values: dict[int, torch.Tensor] = {}
        for layer in (i for i in compressed if c.kv_source(i) == group):
            rec = seen[layer]
            idx = rec["topk"]
            for t in range(0, idx.shape[0], 7):
                for k in range(idx.shape[1]):
                    j = int(idx[t, k])
                    if j >= 0:
                        prev = values.setdefault(j, rec["kv"][t, k])
                        assert torch.equal(prev, rec["kv"][t, k]), (layer, j)


def test_candidate_level(tiny):
    c = tiny.config
    seen, _ = _recorded_prefill(tiny)
    bs, cand = c.candidate_block_size, c.candidate_source_layer
    users = [s for s in c.index_source_layers if s > cand]
    assert users, "the tiny preset must exercise the masked top-k"
    fired = False
    for layer in users:
        rec = seen[layer]
        mask, idx, vis = rec["candidates"], rec["topk"], rec["visible"]
        assert mask is not None
        picked = idx >= 0
        # never outside the published blocks
        assert bool(torch.gather(mask, 1, idx.clamp(min=0))[picked].all())
        for t in range(idx.shape[0]):
            v = int(vis[t])
            if v == 0:
                continue
            newest = (v - 1) // bs
            assert bool(mask[t, newest * bs:v].all()), (layer, t)  # the query's newest block is always in
            assert int(mask[t, :v].sum()) <= c.candidate_topk_blocks * bs
            assert not bool(mask[t, v:].any())
            fired = fired or int(mask[t, :v].sum()) < v
    assert fired, "some query must have had blocks left out"


# --- SWA bounded replay ------------------------------------------------------------------------------------
def test_bounded_replay_equals_exact_for_short_prompts(tiny):
    W = tiny.config.window_size
    toks = _tokens(W, 6)
    exact = _prefill(tiny, _pools(tiny), toks, 0, [0], [W], logits="all")
    pools = _pools(tiny)
    step_rows = [RowSpec(toks, 0, 0, [0], decoder_floor=max(0, len(toks) - W), logits="all")]
    bounded = _run(tiny, pools, step_rows, [toks], decoder_trim=True)  # force the trimmed code path
    assert torch.equal(bounded.logits, exact)


def test_bounded_replay_long_prompt(tiny):
    """Layers >= decoder_start run on the last `window` tokens only; chunked bounded prefill is exact w.r.t. the
    one-shot bounded prefill, decode afterwards works, and the approximation is reported."""
    c = tiny.config
    W, n = c.window_size, 100
    toks = _tokens(n + 6, 7)
    prompt, floor = toks[:n], n - W
    exact_pools, one_pools, chunk_pools = _pools(tiny), _pools(tiny), _pools(tiny)
    exact = _prefill(tiny, exact_pools, prompt, 0, [0, 1, 2, 3], [n])
    one = _run(tiny, one_pools, [RowSpec(prompt, 0, 0, [0, 1, 2, 3], decoder_floor=floor)], [toks])
    assert one.decoder_rows.tolist() == list(range(floor, n))
    assert one.hidden.shape == (n, c.hc_mult, c.dim) and one.draft_taps.shape == (W, 3 * c.dim)
    chunked = _prefill(tiny, chunk_pools, prompt, 0, [0, 1, 2, 3], [30, 50, 20], floor=floor)
    assert (chunked - one.logits).abs().max() < 1e-4
    # decode continues from the bounded caches (decode rows have floor 0: every layer runs)
    dev = []
    for i in range(6):
        p = n + i
        lg = [_run(tiny, pl, [RowSpec([toks[p]], p, 0, [0, 1, 2, 3])], [toks]).logits[0]
              for pl in (exact_pools, one_pools, chunk_pools)]
        assert (lg[1] - lg[2]).abs().max() < 1e-4
        dev.append(lg[0])
    pe, pb = torch.softmax(exact[-1], -1), torch.softmax(one.logits[-1], -1)
    tv = 0.5 * (pe - pb).abs().sum().item()
    kl = (pe * (pe.log() - pb.log())).sum().item()
    print(f"\nbounded vs exact next-token distribution ({n}-token prompt, window {W}): "
          f"KL {kl:.4f}, total variation {tv:.4f}, argmax {'same' if exact[-1].argmax() == one.logits[-1].argmax() else 'differs'}")
    assert tv < 0.5, "the trimmed decoder should stay close to exact on random weights"


def test_logits_below_the_floor_are_refused(tiny):
    toks = _tokens(40, 8)
    with pytest.raises(ValueError, match="decoder_floor"):
        _run(tiny, _pools(tiny), [RowSpec(toks, 0, 0, [0, 1], decoder_floor=30, logits="all")], [toks])


# --- DSpark -------------------------------------------------------------------------------------------------
def test_dspark_draft(tiny):
    c = tiny.config
    a, b = _tokens(80, 9), _tokens(50, 10)
    one, chunked = _pools(tiny), _pools(tiny)
    la = _prefill(tiny, one, a, 0, [0, 1, 2], [80])
    lb = _prefill(tiny, one, b, 1, [3, 4, 5], [50])
    _prefill(tiny, chunked, a, 0, [0, 1, 2], [11, 40, 29])
    _prefill(tiny, chunked, b, 1, [3, 4, 5], [25, 25])
    anchors = torch.stack([la[-1].argmax(), lb[-1].argmax()])
    pos, slots = torch.tensor([79, 49]), torch.tensor([0, 1])
    d1 = tiny.model.draft(one, anchors, pos, slots)
    d2 = tiny.model.draft(chunked, anchors, pos, slots)
    single = tiny.model.draft(one, anchors[1:], pos[1:], slots[1:])
    B = c.dspark_block_size
    assert d1.tokens.shape == (2, B) and d1.logits.shape == (2, B, c.vocab_size)
    assert torch.equal(d1.tokens, d2.tokens) and (d1.logits - d2.logits).abs().max() < 1e-4
    assert torch.equal(single.tokens[0], d1.tokens[1])
    assert bool(((d1.confidence > 0) & (d1.confidence < 1)).all())
    assert torch.equal(d1.tokens, d1.logits.argmax(-1))  # greedy: each token is its (Markov-biased) argmax


def test_image_tokens_route_with_bias_vl_on_the_fast_path() -> None:
    """The MoE's router on the Triton path takes bias_vl for image-placeholder tokens inside the kernel (no where
    launch): the same routed output as the reference body, whose bias is selected per token in torch."""
    lm = build_model("tiny-v41-flash", seed=3, dtype=torch.float64, with_mtp=False, kernels="triton")
    ffn = lm.model.layers[2].ffn
    g = torch.Generator().manual_seed(4)
    ffn.gate.bias_vl.data = torch.randn(ffn.gate.bias_vl.shape, generator=g, dtype=ffn.gate.bias_vl.dtype) * 3
    x = torch.randn(9, lm.config.dim, generator=g, dtype=torch.float64)
    image = torch.zeros(9, dtype=torch.bool)
    image[[2, 5]] = True
    with torch.no_grad():
        fast = ffn(x, image)
        assert ffn.backend == "triton"
        for m in ffn.modules():  # the same weights on the reference bodies
            if hasattr(m, "backend"):
                m.backend = "reference"
        ref = ffn(x, image)
        plain = ffn(x, torch.zeros(9, dtype=torch.bool))
    assert (fast - ref).abs().max() <= 1e-9 * ref.abs().max()
    assert not torch.allclose(ref[[2, 5]], plain[[2, 5]])  # bias_vl changed the image tokens' experts


def test_layers_sharing_a_source_and_picks_share_their_entry_refs(tiny) -> None:
    """StepContext.entry_refs: one EntryRefs (with its `derived` memo) for the layers that read one KV source with
    the same picks; a new pair replaces it (groups of layers are consecutive: the last group's staged rows are
    freed)."""
    from v4serve.models.v4.context import StepContext

    c = tiny.config
    pools = KVPools(make_cache_spec(c, block_size=32), num_blocks=8, num_slots=2)
    ctx = StepContext(build_step([RowSpec(_tokens(40, 1), 0, 0, [0, 1])]), c, pools)
    p1, p2 = torch.zeros(40, 4, dtype=torch.long), torch.ones(40, 4, dtype=torch.long)
    source = c.kv_source_layers[0]
    first = ctx.entry_refs(source, p1)
    assert ctx.entry_refs(source, p1) is first and first.derived == {} and first.picks is p1
    second = ctx.entry_refs(source, p2)
    assert second is not first and second.picks is p2
    assert ctx.entry_refs(source, p1) is not first  # replaced by the second pair
