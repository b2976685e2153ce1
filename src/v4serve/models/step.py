"""What one forward step consumes: the flattened tokens of every row, their positions and cache addressing.

A *row* is the part of one request that this step computes: a decode token, or a chunk of a prompt (possibly
a replay of tokens whose compressed entries are already cached). The model defines this structure; the
engine's runner fills it, so no import runs from models/ up to engine/.

Per-request state lives in two places:
* per-request *slots* (window rings of the last `window` positions, compressor partial groups), addressed by
  `row_slot`;
* paged *blocks* of `block_size` positions (compressed entries and index keys), addressed by `block_table`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..transfer import to_device


@dataclass
class StepInput:
    token_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    token_row: torch.Tensor  # [T] int64: the row of each token
    row_slot: torch.Tensor  # [R] int64: state slot (window rings, compressor state) of each row
    row_start: torch.Tensor  # [R] int64: position of the row's first token in this step
    row_len: torch.Tensor  # [R] int64: number of tokens of the row in this step (may be 0 after trimming)
    row_offset: torch.Tensor  # [R] int64: flat index of the row's first token
    block_table: torch.Tensor  # [R, max_blocks] int64: physical block of each logical block (-1 unused)
    window_floor: torch.Tensor  # [R] int64: window KV below this position is not visible (replay start)
    cached_len: torch.Tensor  # [R] int64: compressed entries of groups ending at or before this are cached
    decoder_floor: torch.Tensor  # [R] int64: V4.1 decoder layers compute only positions >= this (trimmed prefill)
    logits_index: torch.Tensor  # [L] int64: flat token indices whose next-token logits are wanted
    max_context: int  # upper bound on (position + 1) of any token of the step: sizes compressed gathers
    # --- model-specific inputs (V4.1), set by the engine's step hook (models/v41/engine_hooks.py) or by callers
    engram_prev_ids: torch.Tensor | None = None  # [T, max_ngram - 1] ids at p-1, p-2, ... of each token (-1: none)
    engram_rows: torch.Tensor | None = None  # [T, n_engram_layers, heads] precomputed Engram row ids (tools, tests)
    uniform_decode: bool = False  # every row is one decode token (the captured decode graphs)
    one_token_rows: bool = False  # no row has more than one token this step (known on the host: decode steps)
    decoder_trim: bool | None = None  # V4.1's decoder trim: None = the model checks the floors, else forced
    # V4.1's decoder trim prepared by the caller (the chunk graphs, from the rows on the host): the decoder layers'
    # sub-step and the flat indices of its tokens in this step — restrict_to_suffix's result, without its host sync
    decoder_step: StepInput | None = None
    decoder_kept: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def num_rows(self) -> int:
        return int(self.row_slot.shape[0])

    @property
    def device(self) -> torch.device:
        return self.token_ids.device

    def restrict_to_suffix(self, floor: torch.Tensor) -> tuple[StepInput, torch.Tensor]:
        """The sub-step of tokens with position >= floor[row] (a suffix of every row's chunk).

        Returns the sub-step and the flat indices (into this step) of its tokens. Logits indices are remapped;
        the caller guarantees that every token whose logits are wanted is kept. Window KV below the floor is
        not visible in the sub-step (those positions were never computed by the layers that use it).
        """
        keep = self.positions >= floor[self.token_row]
        kept = torch.nonzero(keep).squeeze(-1)
        row_end = self.row_start + self.row_len
        new_start = torch.minimum(torch.maximum(self.row_start, floor), row_end)
        new_len = row_end - new_start
        new_offset = torch.cumsum(new_len, 0) - new_len
        remap = torch.full_like(self.positions, -1)
        remap[kept] = torch.arange(kept.shape[0], device=kept.device)
        sub = replace(
            self,
            token_ids=self.token_ids[kept], positions=self.positions[kept], token_row=self.token_row[kept],
            row_start=new_start, row_len=new_len, row_offset=new_offset,
            window_floor=torch.maximum(self.window_floor, floor),
            logits_index=remap[self.logits_index],
            engram_prev_ids=self.engram_prev_ids[kept] if self.engram_prev_ids is not None else None,
            engram_rows=self.engram_rows[kept] if self.engram_rows is not None else None,
        )
        return sub, kept


@dataclass
class RowSpec:
    """One row of a step, in plain Python (for building steps outside the engine, e.g. tests and tools)."""

    token_ids: list[int]
    start: int
    slot: int
    blocks: list[int]
    window_floor: int = 0
    cached_len: int = 0
    decoder_floor: int = 0
    logits: str = "last"  # "last", "all" (every token from logits_from on) or "none"
    logits_from: int = 0


ALIGN = 2  # int64 elements: every field of a packed step starts on 16 bytes


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass(frozen=True)
class StepLayout:
    """Where each field of a step sits in one packed int64 tensor: token fields [T] x 3, row fields [R] x 7, the
    logits indices [L], then the block table [R, width] row-major. One host tensor, one copy to the device.

    Each field starts on 16 bytes (its length padded to ALIGN elements): Triton compiles a kernel variant for each
    pointer's 16-byte alignment, so fields packed back to back (the positions at 8T bytes, a row field at 24T + 8iR)
    made the parities of T and R a compile key of every kernel taking them — new variants, compiled while serving,
    long after the warm-up (seventeenth session's AgentX run)."""

    tokens: int
    rows: int
    logits: int
    width: int
    one_token_rows: bool = False  # every row has exactly one token (decode steps)

    ROW_FIELDS = ("row_slot", "row_start", "row_len", "row_offset", "window_floor", "cached_len", "decoder_floor")

    @property
    def flat(self) -> int:
        """Length of the part before the block table."""
        return 3 * _aligned(self.tokens) + len(self.ROW_FIELDS) * _aligned(self.rows) + _aligned(self.logits)

    @property
    def size(self) -> int:
        return self.flat + self.rows * self.width

    def unpack(self, packed: torch.Tensor, max_context: int) -> StepInput:
        """A StepInput whose tensors are views of `packed` (laid out as this layout says)."""
        T, R, Tp, Rp = self.tokens, self.rows, _aligned(self.tokens), _aligned(self.rows)
        tok = packed[:3 * Tp].view(3, Tp)[:, :T]
        rows = packed[3 * Tp:3 * Tp + len(self.ROW_FIELDS) * Rp].view(len(self.ROW_FIELDS), Rp)[:, :R]
        fields = dict(zip(self.ROW_FIELDS, rows))
        lo = 3 * Tp + len(self.ROW_FIELDS) * Rp
        return StepInput(token_ids=tok[0], positions=tok[1], token_row=tok[2], **fields,
                         logits_index=packed[lo:lo + self.logits],
                         block_table=packed[self.flat:self.size].view(R, self.width), max_context=int(max_context),
                         one_token_rows=self.one_token_rows)


def pack_step(rows: list[RowSpec], width: int | None = None,
              logits: int | None = None) -> tuple[torch.Tensor, StepLayout]:
    """The step of `rows` as one host int64 tensor and its layout; `width`: block-table columns (default the widest
    row's block count), padded with -1; `logits`: the logits indices padded to this many with token 0's (a captured
    step's fixed logits rows)."""
    toks: list[int] = []
    pos: list[int] = []
    trow: list[int] = []
    lidx: list[int] = []
    lens: list[int] = []
    offs: list[int] = []
    for r, row in enumerate(rows):
        base, n = len(toks), len(row.token_ids)
        toks += row.token_ids
        pos += range(row.start, row.start + n)
        trow += [r] * n
        if row.logits == "all":
            lidx += range(base + max(0, row.logits_from - row.start), base + n)
        elif row.logits == "last" and n:
            lidx.append(base + n - 1)
        lens.append(n)
        offs.append(base)
    if logits is not None:
        if len(lidx) > logits:
            raise ValueError(f"the rows want {len(lidx)} logits rows, more than the {logits} asked for")
        lidx += [0] * (logits - len(lidx))
    nb = width if width is not None else max([len(r.blocks) for r in rows] + [1])
    table: list[int] = []
    for r, row in enumerate(rows):
        if len(row.blocks) > nb:
            raise ValueError(f"row {r} has {len(row.blocks)} blocks, more than the table's {nb} columns")
        table += row.blocks
        table += [-1] * (nb - len(row.blocks))
    layout = StepLayout(len(toks), len(rows), len(lidx), nb, bool(rows) and all(n == 1 for n in lens))
    fields = (toks, pos, trow, [r.slot for r in rows], [r.start for r in rows], lens, offs,
              [r.window_floor for r in rows], [r.cached_len for r in rows], [r.decoder_floor for r in rows], lidx)
    # one conversion of one list (per-row tensor writes cost more than the whole list at decode sizes), built by list
    # extends: this runs for every step
    flat: list[int] = []
    for f in fields:
        flat += f
        flat += [0] * (_aligned(len(f)) - len(f))
    packed = torch.tensor(flat + table, dtype=torch.int64)
    return packed, layout


def build_step(rows: list[RowSpec], device: torch.device | str = "cpu", max_context: int | None = None) -> StepInput:
    """The StepInput of `rows` on `device`: one host tensor, one non-blocking copy."""
    packed, layout = pack_step(rows)
    ctx = max_context if max_context is not None else max([r.start + len(r.token_ids) for r in rows] + [1])
    return layout.unpack(to_device(packed, device), ctx)
