"""Staged prompt chunks (ops/kernels/attention_stage.py): the records decoded once into plain rows give the fused
attention the same values it decodes in registers, so the outputs are the same bits (on the GPU: within rounding, see
_same); the rule that takes staging
reads host-side facts only. The cases are test_attention.py's (pools in every stored format, block tables with holes
and unallocated tails, picks with -1s, dense visibility), with enough tokens a row for the rule to take them."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from v4serve.ops import attention as attn
from v4serve.ops.kernels import attention as kernel
from v4serve.ops.kernels import attention_stage as stage

from test_attention import DEVICE, EXACT, FLASH, ON_GPU, SHAPE, TOL, _case, _pool, _rel

STORED = [("v4_fp8", "v4_fp8"), ("fp8_b32", "nvfp4"), ("fp8_b32", "fp8_b32"), ("plain", "nvfp4"), ("nvfp4", "plain")]
PROMPT = (2, (9, 12))  # two rows of a prompt-sized chunk: >= MIN_TOKENS_PER_ROW tokens a row
ONE_CONFIG = kernel.GPU_CONFIG if ON_GPU else kernel.INTERPRETER_CONFIG
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")


def _same(staged: torch.Tensor, inreg: torch.Tensor) -> None:
    """The same bits under the interpreter. On the GPU the kernel variant that loads plain rows and the one that
    decodes records are two compilations, whose floating-point contraction ptxas chooses per kernel (as the mHC
    kernels found: ops/kernels/mhc.py), so there the outputs agree to the dtype's rounding."""
    if not ON_GPU:
        assert torch.equal(staged, inreg)
        return
    print(f"staged vs in registers: bits equal {torch.equal(staged, inreg)}, max rel {_rel(staged, inreg):.1e}")
    assert _rel(staged, inreg) < 1e-2


@pytest.mark.parametrize("kind", ["v4_fp8", "fp8_b32", "nvfp4"])
def test_decoded_rows_equal_the_pools_read(kind: str) -> None:
    g = torch.Generator().manual_seed(1)
    pool = _pool(kind, torch.float32, 50, g)
    rows = torch.tensor([3, 0, 50, 7, 7, 49, 12], device=DEVICE)  # repeats and the trash row
    for dtype in (torch.float32, torch.bfloat16):
        assert torch.equal(stage.decode_rows(pool, rows, dtype), pool.read(rows, dtype))
    assert stage.decode_rows(pool, rows[:0], torch.float32).shape == (0, pool.codec.dim)


# every stored format as window and as entries, CSA picks / HCA dense / window only, both kernel modes
CASES = [(w, c, m, None) for (w, c) in STORED for m in ("picks", "dense")] + \
    [(w, c, "picks", FLASH) for (w, c) in STORED[:3]] + \
    [("fp8_b32", None, "none", None), ("v4_fp8", None, "none", FLASH)]


@pytest.mark.parametrize("wkind,ckind,mode,cfg", CASES)
def test_staged_rows_give_the_same_bits(wkind: str, ckind: str | None, mode: str, cfg) -> None:
    """Staged = decoded in registers, bit for bit (both decode each record exactly to the same dtype), and both
    equal the reference."""
    cfg = cfg or ONE_CONFIG  # gpu_config would choose by format: one config for both, the same reduction order
    args = _case(wkind, ckind, mode, EXACT, seed=hash((wkind, ckind, mode)) % 1000, rows_tokens=PROMPT)
    q, cos, sin, fresh, sink, scale, window, entries = args
    assert stage.wanted(q.shape[0], window, entries, q.dtype, q.device)
    staged = kernel.attend(q, cos, sin, fresh, sink, scale, None, window, entries, config=cfg, stage=True)
    inreg = kernel.attend(q, cos, sin, fresh, sink, scale, None, window, entries, config=cfg, stage=False)
    _same(staged, inreg)
    ref = attn.attend_reference(q, cos, sin, fresh, sink, scale, None, window, entries)
    assert _rel(staged, ref) < TOL


def test_bf16_staged_as_in_registers() -> None:
    args = _case("fp8_b32", "nvfp4", "picks", torch.bfloat16, seed=3, rows_tokens=PROMPT)
    a = kernel.attend(*args[:6], None, *args[6:], config=ONE_CONFIG, stage=True)
    b = kernel.attend(*args[:6], None, *args[6:], config=ONE_CONFIG, stage=False)
    _same(a, b)


def test_staged_addressing_keeps_the_tokens_views() -> None:
    """Ring slot i -> staged row i; row r's block c -> staged block r * nb + c, holes included (they read the trash
    block's decoded rows, never visible)."""
    window, entries = _case("fp8_b32", "nvfp4", "dense", EXACT, seed=4, rows_tokens=PROMPT)[6:]
    w2, e2 = stage.stage(window, entries, EXACT)
    assert w2.pool.codec.kind == "plain" and e2.pool.codec.kind == "plain"
    assert torch.equal(w2.pool.data, window.pool.read(window.ring_rows, EXACT))
    R, nb = entries.where.block_table.shape
    j = torch.arange(nb * entries.where.per_block, device=DEVICE)
    for r in range(R):
        want = entries.pool.read(entries.where.token_rows(torch.tensor([r], device=DEVICE), j.unsqueeze(0)), EXACT)
        got = e2.pool.data[e2.where.token_rows(torch.tensor([r], device=DEVICE), j.unsqueeze(0))]
        assert torch.equal(got, want)


def test_the_rule_reads_host_facts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Prompt chunks (>= 4 tokens a row, >= 16 in all) over stored formats stage; decode batches, plain records, an
    exhausted budget and V4SERVE_ATTN_STAGE=0 do not."""
    q, *_, window, entries = _case("fp8_b32", "nvfp4", "picks", EXACT, seed=5, rows_tokens=PROMPT)
    T, dev = q.shape[0], q.device
    assert stage.wanted(T, window, entries, q.dtype, dev)
    assert stage.wanted(T, window, None, q.dtype, dev)  # window-only layers
    assert not stage.wanted(2 * stage.MIN_TOKENS_PER_ROW - 1, window, entries, q.dtype, dev)  # a decode-like batch
    assert not stage.wanted(stage.MIN_TOKENS - 1, window, entries, q.dtype, dev)  # a few tokens
    plain_w, plain_e = _case("plain", "plain", "picks", EXACT, seed=5, rows_tokens=PROMPT)[6:]
    assert not stage.wanted(T, plain_w, plain_e, q.dtype, dev)
    assert not stage.wanted(T, plain_w, None, q.dtype, dev)
    need = stage.staged_bytes(window, entries, q.dtype)
    R, nb = entries.where.block_table.shape
    D = SHAPE[1]
    assert need == (window.ring_rows.shape[0] + R * nb * entries.where.per_block) * D * q.element_size()
    monkeypatch.setattr(stage, "STAGE_BUDGET", need - 1)
    assert not stage.wanted(T, window, entries, q.dtype, dev)
    monkeypatch.setattr(stage, "STAGE_BUDGET", need)
    assert stage.wanted(T, window, entries, q.dtype, dev)
    monkeypatch.setenv(stage.STAGE_ENV, "0")
    assert not stage.wanted(T, window, entries, q.dtype, dev)


def test_work_follows_the_block_tables_width() -> None:
    """The staged rows are the block tables' (eager steps: as wide as the longest row), never max_entries."""
    window, entries = _case("fp8_b32", "nvfp4", "dense", EXACT, seed=6, rows_tokens=PROMPT)[6:]
    wide = dataclasses.replace(entries, where=dataclasses.replace(entries.where, max_entries=1 << 20))
    assert stage.staged_bytes(window, wide, EXACT) == stage.staged_bytes(window, entries, EXACT)


# decode launches (V4SERVE_ATTN_STAGE=picks): one token a row, and a row of three (a V4.1 decoder sub-step's shape)
DECODE = [(3, (1, 1, 1)), (2, (1, 3))]
PICK_CASES = [(w, c, "picks", None, rt) for (w, c) in STORED for rt in DECODE] + \
    [(w, c, "picks", FLASH, DECODE[0]) for (w, c) in STORED[:3]] + \
    [("fp8_b32", "nvfp4", "dense", None, DECODE[0]), ("fp8_b32", None, "none", None, DECODE[0])]


@pytest.mark.parametrize("wkind,ckind,mode,cfg,rows_tokens", PICK_CASES)
def test_staged_picks_give_the_same_bits(wkind: str, ckind: str | None, mode: str, cfg, rows_tokens) -> None:
    """The window rings and only the picked entries staged (20 picks a token with -1 holes and an empty selection,
    padded to 24 = 3 blocks of 8 entries; HCA and window-only launches: the window alone): the bits of the records
    decoded in registers, and the reference."""
    cfg = cfg or ONE_CONFIG
    args = _case(wkind, ckind, mode, EXACT, seed=hash((wkind, ckind, mode, rows_tokens)) % 1000,
                 rows_tokens=rows_tokens)
    q, cos, sin, fresh, sink, scale, window, entries = args
    assert not stage.wanted(q.shape[0], window, entries, q.dtype, q.device)  # the prompt rule leaves decode
    staged = kernel.attend(q, cos, sin, fresh, sink, scale, None, window, entries, config=cfg, stage=stage.PICKS)
    inreg = kernel.attend(q, cos, sin, fresh, sink, scale, None, window, entries, config=cfg, stage=False)
    _same(staged, inreg)
    ref = attn.attend_reference(q, cos, sin, fresh, sink, scale, None, window, entries)
    assert _rel(staged, ref) < TOL


def test_staged_picks_addressing() -> None:
    """Token t's pick j -> staged row t * Kp + j holding the picked entry's values (through the token's block table:
    holes read the trash block), renamed to j; -1 picks stay -1 and their rows, like the padding's, are zeros. The
    staged block table's row t addresses exactly rows t * Kp .. t * Kp + Kp - 1."""
    window, entries = _case("fp8_b32", "nvfp4", "picks", EXACT, seed=7, rows_tokens=DECODE[1])[6:]
    w2, e2 = stage.stage_picks(window, entries, EXACT)
    assert torch.equal(w2.pool.data, window.pool.read(window.ring_rows, EXACT))
    picks, where = entries.picks, entries.where
    T, K = picks.shape
    KP = e2.pool.data.shape[0] // T
    assert KP == 24 and e2.where.block_table.shape == (T, KP // where.per_block)
    assert torch.equal(e2.picks, torch.where(picks >= 0, torch.arange(K, device=DEVICE), -1))
    j = torch.arange(KP, device=DEVICE)
    for t in range(T):
        staged = e2.pool.data[e2.where.token_rows(e2.where.token_row[t:t + 1], j.unsqueeze(0))][0]
        assert torch.equal(staged, e2.pool.data[t * KP:(t + 1) * KP])
        ok = picks[t] >= 0
        want = entries.pool.read(where.token_rows(where.token_row[t:t + 1], picks[t].clamp(min=0).unsqueeze(0))[0],
                                 EXACT)
        assert torch.equal(staged[:K][ok], want[ok])
        assert not staged[:K][~ok].any() and not staged[K:].any()


def test_staged_picks_made_once_per_shared_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Entries with a `derived` memo are staged by the first call and reused by the next ones with the same object
    (layers that read one KV source with the same picks), per dtype: one staging launch, the same staged entries as
    without the memo; each call still stages its own window."""
    window, entries = _case("fp8_b32", "nvfp4", "picks", EXACT, seed=7, rows_tokens=DECODE[1])[6:]
    shared = dataclasses.replace(entries, derived={})
    launches = []
    real = stage._stage_entries
    monkeypatch.setattr(stage, "_stage_entries", lambda e, d: launches.append(d) or real(e, d))
    w1, e1 = stage.stage_picks(window, shared, EXACT)
    w2, e2 = stage.stage_picks(window, shared, EXACT)
    assert e2 is e1 and e1.derived is None and len(launches) == 1
    assert w2 is not w1 and torch.equal(w2.pool.data, w1.pool.data)
    _, alone = stage.stage_picks(window, entries, EXACT)  # no memo: staged again, the same rows
    assert torch.equal(alone.pool.data, e1.pool.data) and torch.equal(alone.picks, e1.picks) and len(launches) == 2
    stage.stage_picks(window, shared, torch.float32)  # another dtype: staged apart
    assert len(launches) == 3 and set(shared.derived) == {("picks", EXACT), ("picks", torch.float32)}
    monkeypatch.setenv(stage.SHARED_ENV, "0")  # the A/B switch: staged again
    stage.stage_picks(window, shared, EXACT)
    assert len(launches) == 4


def test_staged_addressing_is_one_iota_buffer() -> None:
    """The staged ring rows, block table and token rows are arange values viewed from one buffer per device and dtype
    (no launch per call); a longer request replaces the buffer with a larger one."""
    window, entries = _case("fp8_b32", "nvfp4", "picks", EXACT, seed=7, rows_tokens=DECODE[1])[6:]
    w2, e2 = stage.stage_picks(window, entries, EXACT)
    for got in (w2.ring_rows, e2.where.block_table.reshape(-1), e2.where.token_row):
        assert torch.equal(got, torch.arange(got.numel(), device=DEVICE))
        base = stage.iota(1, got.dtype, got.device)
        assert got.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    n = stage.IOTA_MIN + 5
    long = stage.iota(n, torch.int32, torch.device("cpu"))
    assert torch.equal(long, torch.arange(n, dtype=torch.int32)) and stage.iota(3, torch.int32, "cpu").data_ptr() \
        == long.data_ptr()


def test_the_picks_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """By default CSA launches over PICK_FORMATS' entries (V4.1's nvfp4), within the budget; V4SERVE_ATTN_STAGE=picks
    any stored entry format; "prompt" and "0" none; never HCA or window-only launches or plain records.
    attend(stage=None) then takes it (the same bits as stage="picks"), and prompt chunks keep the prompt rule's
    staging."""
    args = _case("fp8_b32", "nvfp4", "picks", EXACT, seed=8, rows_tokens=DECODE[0])
    q, cos, sin, fresh, sink, scale, window, entries = args
    v4_w, v4_e = _case("v4_fp8", "v4_fp8", "picks", EXACT, seed=8, rows_tokens=DECODE[0])[6:]
    assert stage.picks_wanted(window, entries, q.dtype) and not stage.picks_wanted(v4_w, v4_e, q.dtype)
    for off in ("0", stage.PROMPT):
        monkeypatch.setenv(stage.STAGE_ENV, off)
        assert not stage.picks_wanted(window, entries, q.dtype)
    monkeypatch.setenv(stage.STAGE_ENV, stage.PICKS)
    assert stage.picks_wanted(window, entries, q.dtype) and stage.picks_wanted(v4_w, v4_e, q.dtype)
    dense_w, dense_e = _case("fp8_b32", "nvfp4", "dense", EXACT, seed=8, rows_tokens=DECODE[0])[6:]
    assert not stage.picks_wanted(dense_w, dense_e, q.dtype) and not stage.picks_wanted(window, None, q.dtype)
    plain_w, plain_e = _case("plain", "plain", "picks", EXACT, seed=8, rows_tokens=DECODE[0])[6:]
    assert not stage.picks_wanted(plain_w, plain_e, q.dtype)
    T, D = q.shape[0], SHAPE[1]
    need = (window.ring_rows.shape[0] + T * 24) * D * q.element_size()
    monkeypatch.setattr(stage, "STAGE_BUDGET", need - 1)
    assert not stage.picks_wanted(window, entries, q.dtype)
    monkeypatch.setattr(stage, "STAGE_BUDGET", need)
    assert stage.picks_wanted(window, entries, q.dtype)
    taken = []
    monkeypatch.setattr(stage, "stage_picks", lambda *a, f=stage.stage_picks: taken.append(1) or f(*a))
    auto = kernel.attend(*args[:6], None, window, entries, config=ONE_CONFIG)
    assert taken and torch.equal(auto, kernel.attend(*args[:6], None, window, entries, config=ONE_CONFIG,
                                                     stage=stage.PICKS))
    taken.clear()
    prompt = _case("fp8_b32", "nvfp4", "picks", EXACT, seed=8, rows_tokens=PROMPT)
    kernel.attend(*prompt[:6], None, *prompt[6:], config=ONE_CONFIG)
    assert not taken
