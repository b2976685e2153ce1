"""Prompt chunks over stored records: the records a launch reads, decoded once into staging rows of the query dtype.

The fused attention decodes each record it reads in registers (attention_rows.decode), which at decode sizes is the
point: one read of the stored bytes. A prompt chunk's tokens read mostly the same records, so there each record was
decoded once per token and head block: a 2,048-token chunk over V4.1's NVFP4 entries and FP8 window rows took 4.05 ms
a layer on the H100 (twenty-fifth session, `profile_step.py v41-flash-e16-engram1m --prefill 2048`), about twice the
same chunk's time over bf16 records (RESULTS.md, twenty-second session). Here the window rings of the launch's rows and
every compressed entry their block tables address are decoded once (`_stage_kernel`, exact: every value of every
stored format is a bf16 value), and the attention runs over these "plain" rows with the same addressing: ring slot i
becomes staged row i, and block c of row r becomes staged block r * nb + c.

Taken where it does less decoding (host-side facts only, no synchronisation): the launch has at least
MIN_TOKENS_PER_ROW tokens a row and MIN_TOKENS in all (prompt chunks, V4.1's decoder sub-step; never a decode batch,
whose rows each read a few hundred of their thousands of entries), the staged bytes fit STAGE_BUDGET (the eager
steps' block tables are as wide as their longest row; a step of many long rows keeps the in-register decode), and no
CUDA graph is being captured (a captured step's block table is as wide as max_model_len).

Decode launches: there each record is read once per token, but decoded in registers once per head block and D share
of its program grid (8 programs a token with the heads mode's 16-head blocks, D in halves). `stage_picks` decodes a CSA
launch's window rings and only the entries its tokens picked (T x K rows, a size fixed by the launch: graph-safe) and
renames the picks: pick j of token t becomes staged entry j of a block table whose row t addresses staged rows
t * Kp .. t * Kp + Kp - 1 (K rounded up to whole blocks). Taken by default over PICK_FORMATS' entries (measured);
HCA and window-only launches keep the in-register decode (their window staged alone was slower: H100, V4.1 HCA at
64K, T = 32 191 -> 334 us).

V4SERVE_ATTN_STAGE: "0" never stages (the A/B switch), "prompt" only by the prompt rule, "picks" also stages the
picks over every stored entry format; unset, the prompt rule and the picks over PICK_FORMATS.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from ..env import get as env_get
from . import cdiv, interpreting, step_jit
from .attention_rows import FORMATS, decode, entry_rows
from .pdl import enter as pdl_enter
from .pdl import launch as pdl_launch

MIN_TOKENS_PER_ROW = 4
MIN_TOKENS = 16  # below it little decoding is saved, and the launch runs the heads mode (gpu_config)
STAGE_BUDGET = 512 << 20  # staged bytes per launch (a 2K chunk of one row at 256K context, ratio 1: 512 MiB)
STAGE_ENV = "V4SERVE_ATTN_STAGE"  # "0", "prompt", "picks" or unset (the module docstring)
PICKS = "picks"
SHARED_ENV = "V4SERVE_ATTN_STAGE_SHARED"  # "0": every layer stages its picks, shared entries too (the A/B switch)
PROMPT = "prompt"
# entry formats whose decode launches stage their CSA picks by default. nvfp4 (V4.1's 288-B entries): H100,
# `benchmarks/kernels/attention.py --format v41 --decode-only` at 64K (twenty-ninth session), staging included:
# T = 1 37.2 -> 30.3 us, T = 32 193.5 -> 106.1, T = 64 343.9 -> 208.4. V4's 584-B records are not timed so: opt-in
PICK_FORMATS = ("nvfp4",)


_IOTA: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}
IOTA_MIN = 1 << 16  # elements of a first iota buffer: every decode launch's staged rows and blocks fit it


def iota(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """torch.arange(n) as a view of one buffer per device and dtype, made once (again, larger, when one is short): the
    staged addressing is a fixed identity, so a decode step launches no arange for it (three a layer in V4.1's
    graphed step: 114 launches, ~0.15 ms of its replay on the H100). Read-only for its users."""
    key = (torch.device(device), dtype)
    buf = _IOTA.get(key)
    if buf is None or buf.shape[0] < n:
        buf = _IOTA[key] = torch.arange(max(n, IOTA_MIN), dtype=dtype, device=device)
    return buf[:n]


@dataclass(frozen=True)
class PlainCodec:
    kind: str = "plain"


@dataclass
class StagedPool:
    """Decoded rows in the shape the kernels read a pool: `.data` [rows, D] and a "plain" codec."""

    data: torch.Tensor
    codec: PlainCodec = PlainCodec()


@step_jit
def _stage_kernel(src_ptr, n, u8_ptr, h16_ptr, val_ptr, stride, out_ptr,
                  FMT: tl.constexpr, AL: tl.constexpr, D: tl.constexpr, RD: tl.constexpr, BN: tl.constexpr,
                  DC: tl.constexpr, PDL: tl.constexpr = False):
    """Pool rows src[i] (i < n) decoded to out[i, :] in out's dtype, BN rows by DC dims a program."""
    pdl_enter(PDL)  # wait for the kernel before, let the next one launch (kernels/pdl.py)
    stride = (stride // AL) * AL  # said to be a multiple of AL: the record loads vectorise
    i = tl.program_id(0) * BN + tl.arange(0, BN)
    ok = i < n
    rows = tl.load(src_ptr + i, mask=ok, other=0)
    c0 = tl.program_id(1) * DC
    v = decode(rows, ok, c0, u8_ptr, h16_ptr, val_ptr, stride, FMT, DC, D, RD, out_ptr.dtype.element_ty)
    cols = c0 + tl.arange(0, DC)
    tl.store(out_ptr + i.to(tl.int64)[:, None] * D + cols[None, :], v, mask=ok[:, None])


@step_jit
def _stage_picks_kernel(pick_ptr, pick_stride, tok_row_ptr, bt_ptr, bt_stride, K, KP, n, ratio, block_size, epb,
                        trash_block, u8_ptr, h16_ptr, val_ptr, stride, out_ptr, new_pick_ptr,
                        FMT: tl.constexpr, AL: tl.constexpr, D: tl.constexpr, RD: tl.constexpr, BN: tl.constexpr,
                        DC: tl.constexpr, PDL: tl.constexpr = False):
    """Staged row i = t * KP + j (i < n = T * KP): token t's pick j decoded through its block table (the attention's
    addressing, attention_rows.entry_rows), zeros for j >= K or a -1 pick; the D-chunk-0 programs write the renamed
    picks (j, or -1)."""
    pdl_enter(PDL)  # wait for the kernel before, let the next one launch (kernels/pdl.py)
    stride = (stride // AL) * AL
    i = tl.program_id(0) * BN + tl.arange(0, BN)
    live = i < n
    t = (i // KP).to(tl.int64)
    j = i % KP
    has = live & (j < K)
    pick = tl.load(pick_ptr + t * pick_stride + j, mask=has, other=-1)
    ok = pick >= 0
    r = tl.load(tok_row_ptr + t, mask=live, other=0)
    rows = entry_rows(tl.where(ok, pick, 0).to(tl.int32), ok, bt_ptr, r, bt_stride, ratio, block_size, epb,
                      trash_block)
    c0 = tl.program_id(1) * DC
    v = decode(rows, ok, c0, u8_ptr, h16_ptr, val_ptr, stride, FMT, DC, D, RD, out_ptr.dtype.element_ty)
    cols = c0 + tl.arange(0, DC)
    tl.store(out_ptr + i.to(tl.int64)[:, None] * D + cols[None, :], v, mask=live[:, None])
    if tl.program_id(1) == 0:
        tl.store(new_pick_ptr + t * K + j, tl.where(ok, j, -1).to(new_pick_ptr.dtype.element_ty), mask=has)


def decode_rows(pool, rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """pool.read(rows, dtype) of a stored-format pool for a 1-D index, as one Triton launch -> [n, D]."""
    n, D = rows.shape[0], pool.codec.dim
    out = torch.empty(n, D, dtype=dtype, device=pool.data.device)
    if n == 0:
        return out
    BN, DC, views, const = _tiles(pool)
    _stage_kernel[(cdiv(n, BN), D // DC)](rows, n, *views, out, **const, num_warps=4, **pdl_launch(pool.data))
    return out


def _tiles(pool) -> tuple[int, int, tuple, dict]:
    """A stored pool's staging tiles (rows BN by dims DC a program), its byte / half / value views with the record
    stride, and the kernels' format constants."""
    data, kind, D = pool.data, pool.codec.kind, pool.codec.dim
    BN, DC = (16, 64) if interpreting() else (32, 128)
    DC = min(DC, D)
    views = (data, data.view(torch.bfloat16) if kind == "v4_fp8" else data, data, data.stride(0))
    return BN, DC, views, {"FMT": FORMATS[kind], "AL": math.gcd(data.stride(0), 16), "D": D,
                           "RD": pool.codec.rope_dim, "BN": BN, "DC": DC}


def _window_rows(window) -> int:
    """Rows the window's staging decodes: its rings' (none over plain records)."""
    return window.ring_rows.shape[0] if window.pool.codec.kind != "plain" else 0


def enabled() -> bool:
    return env_get(STAGE_ENV) not in ("0",)


def staged_bytes(window, entries, dtype: torch.dtype) -> int:
    """Bytes the staging rows of this launch take: the rings' rows and (where entries) every entry the block tables
    address."""
    D = window.pool.data.shape[1] if window.pool.codec.kind == "plain" else window.pool.codec.dim
    rows = _window_rows(window)
    if entries is not None and entries.pool.codec.kind != "plain":
        bt = entries.where.block_table
        rows += bt.shape[0] * bt.shape[1] * entries.where.per_block
    return rows * D * dtype.itemsize


def wanted(tokens: int, window, entries, dtype: torch.dtype, device: torch.device) -> bool:
    """The rule of the module docstring, from host-side facts only."""
    if tokens < MIN_TOKENS:
        return False
    stored = window.pool.codec.kind != "plain" or (entries is not None and entries.pool.codec.kind != "plain")
    if not stored or not enabled():
        return False
    # the step's rows: the block table's (entries), else the rings' (W slots a row)
    rows = entries.where.block_table.shape[0] if entries is not None else \
        max(1, window.ring_rows.shape[0] // max(1, window.src.shape[1]))
    if tokens < MIN_TOKENS_PER_ROW * rows:
        return False
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return False
    return staged_bytes(window, entries, dtype) <= STAGE_BUDGET


def _stage_window(window, dtype: torch.dtype):
    """The window over staged rows: ring slot i -> staged row i."""
    if window.pool.codec.kind == "plain":
        return window
    ring = window.ring_rows
    data = decode_rows(window.pool, ring.reshape(-1), dtype)
    return replace(window, pool=StagedPool(data),
                   ring_rows=iota(ring.shape[0], ring.dtype, ring.device))


def stage(window, entries, dtype: torch.dtype):
    """(window, entries) over staged plain rows: the same tokens' views of the same values."""
    window = _stage_window(window, dtype)
    if entries is not None and entries.pool.codec.kind != "plain":
        where = entries.where
        bt = where.block_table
        R, nb, epb = bt.shape[0], bt.shape[1], where.per_block
        blocks = torch.where(bt < 0, where.num_blocks, bt).long()
        src = (blocks.unsqueeze(2) * epb + iota(epb, torch.int64, bt.device)).reshape(-1)
        data = decode_rows(entries.pool, src, dtype)
        staged_bt = iota(R * nb, bt.dtype, bt.device).view(R, nb)
        entries = replace(entries, pool=StagedPool(data), where=replace(where, block_table=staged_bt,
                                                                        num_blocks=R * nb))
    return window, entries


def _padded_picks(entries) -> int:
    """K rounded up to whole blocks of the staged block table."""
    epb = entries.where.per_block
    return cdiv(entries.picks.shape[1], epb) * epb


def picks_wanted(window, entries, dtype: torch.dtype) -> bool:
    """A CSA launch (picks) that the prompt rule left, over PICK_FORMATS' entries (V4SERVE_ATTN_STAGE=picks: any
    stored format, or a stored window alone), the staged bytes within STAGE_BUDGET; host-side facts only. (Blocks hold
    whole entries: cache/spec.py asks block sizes that are multiples of every compress ratio.)"""
    mode = env_get(STAGE_ENV)
    if mode in ("0", PROMPT) or entries is None or entries.picks is None:
        return False
    kind = entries.pool.codec.kind
    if mode != PICKS and kind not in PICK_FORMATS:
        return False
    stored = kind != "plain"
    rows = _window_rows(window) + (entries.picks.shape[0] * _padded_picks(entries) if stored else 0)
    return rows > 0 and rows * entries.pool.codec.dim * dtype.itemsize <= STAGE_BUDGET


def stage_picks(window, entries, dtype: torch.dtype):
    """(window, entries) over staged plain rows holding the window rings and only the picked entries (the module
    docstring): the same tokens' views of the same values, in the same pick order. A launch without picks (HCA,
    window only) or over plain entries has its window staged alone. Entries with a `derived` memo are staged once:
    later calls with the same object (layers reading the same KV source and picks) reuse the staged rows."""
    window = _stage_window(window, dtype)
    if entries is None or entries.picks is None or entries.pool.codec.kind == "plain":
        return window, entries
    memo, key = entries.derived if env_get(SHARED_ENV) != "0" else None, ("picks", dtype)
    if memo is not None and key in memo:  # staged by an earlier layer of the step from these same entries
        return window, memo[key]
    staged = _stage_entries(entries, dtype)
    if memo is not None:
        memo[key] = staged
    return window, staged


def _stage_entries(entries, dtype: torch.dtype):
    """stage_picks' entries: the picked ones decoded into staged rows, the picks renamed."""
    where, picks = entries.where, entries.picks
    T, K = picks.shape
    KP = _padded_picks(entries)
    nb = KP // where.per_block
    dev = picks.device
    out = torch.empty(T * KP, entries.pool.codec.dim, dtype=dtype, device=dev)
    new_picks = torch.empty_like(picks)
    if T:
        BN, DC, views, const = _tiles(entries.pool)
        bt = where.block_table
        _stage_picks_kernel[(cdiv(T * KP, BN), const["D"] // DC)](
            picks, picks.stride(0), where.token_row, bt, bt.stride(0), K, KP, T * KP, where.ratio, where.block_size,
            where.per_block, where.num_blocks, *views, out, new_picks, **const, num_warps=4,
            **pdl_launch(entries.pool.data))
    staged = replace(where, block_table=iota(T * nb, where.block_table.dtype, dev).view(T, nb),
                     token_row=iota(T, where.token_row.dtype, dev), num_blocks=T * nb)
    return replace(entries, pool=StagedPool(out), where=staged, picks=new_picks, derived=None)
