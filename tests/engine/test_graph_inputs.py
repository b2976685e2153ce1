"""The decode graphs' static inputs (engine/graphs.py), without a GPU: which steps may replay a captured graph, and
what lands in the captured buffers (the step's rows, padding routed to the trash slot, V4.1's Engram history). The
graphs themselves are stand-ins here; tests/gpu/test_cuda.py replays real ones against eager steps."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from v4serve.engine.graphs import DecodeGraphs
from v4serve.models.step import RowSpec

TRASH = 7


class _Graph:
    def __init__(self) -> None:
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1


def _graphs(engram: int) -> DecodeGraphs:
    g = DecodeGraphs(None, SimpleNamespace(trash_slot=TRASH), (1, 4), 256, 8, 64, torch.device("cpu"), engram)
    for b in g.sizes:
        g.graphs[b] = _Graph()
        g.outputs[b] = torch.arange(b * 3, dtype=torch.float32).view(b, 3)
    return g


def _sched(rows: int) -> SimpleNamespace:
    req = SimpleNamespace(request=SimpleNamespace(params=SimpleNamespace(prompt_logprobs=None)))
    return SimpleNamespace(rows=[req] * rows)


def _decode_rows(rows: int, blocks: int = 1) -> list[RowSpec]:
    return [RowSpec([10 + r], 40 + r, r, [100 * r + j for j in range(blocks)]) for r in range(rows)]


def _hook(prev: torch.Tensor | None = None, rows: torch.Tensor | None = None):
    def hook(sched, step) -> None:
        step.engram_prev_ids, step.engram_rows = prev, rows
    return hook


def test_a_decode_step_fills_the_captured_buffers_and_replays_its_bucket() -> None:
    g = _graphs(engram=3)
    prev = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, -1]])
    out = g.run(_sched(3), _decode_rows(3), _hook(prev))
    assert g.graphs[4].replays == 1 and g.graphs[1].replays == 0
    assert torch.equal(out, g.outputs[4][:3])
    assert torch.equal(g.engram[:3], prev) and bool((g.engram[3] == -1).all())  # padding: none
    step = g.steps[4]  # what the captured graph reads
    assert step.token_ids.tolist() == [10, 11, 12, 0] and step.positions.tolist() == [40, 41, 42, 0]
    assert step.row_slot.tolist() == [0, 1, 2, TRASH]  # the padded row writes only the trash slot
    assert step.block_table[:, :2].tolist() == [[0, -1], [100, -1], [200, -1], [-1, -1]]
    assert bool((step.block_table == -1).sum() == 4 * g.max_blocks - 3)
    assert step.token_row.tolist() == step.row_offset.tolist() == step.logits_index.tolist() == [0, 1, 2, 3]
    assert step.row_len.tolist() == [1, 1, 1, 1] and step.row_start.tolist() == [40, 41, 42, 0]
    assert step.uniform_decode and step.decoder_trim is False and step.max_context == 256
    assert step.engram_prev_ids.data_ptr() == g.engram.data_ptr()  # the model reads the static buffer


def test_the_buffers_forget_an_earlier_step() -> None:
    """A step with fewer rows or blocks than the one before leaves nothing of it in the captured buffers: its
    padding rows and the table columns it does not use are back to the trash slot and -1."""
    g = _graphs(engram=3)
    assert g.run(_sched(4), _decode_rows(4, blocks=4), _hook(torch.arange(12).view(4, 3))) is not None
    assert g.run(_sched(2), _decode_rows(2, blocks=2), _hook(torch.zeros(2, 3, dtype=torch.int64))) is not None
    step = g.steps[4]
    fresh = _graphs(engram=3)
    fresh.run(_sched(2), _decode_rows(2, blocks=2), _hook(torch.zeros(2, 3, dtype=torch.int64)))
    for name in ("token_ids", "positions", "row_slot", "row_start", "window_floor", "cached_len", "decoder_floor",
                 "block_table"):
        assert torch.equal(getattr(step, name), getattr(fresh.steps[4], name)), name
    assert torch.equal(g.engram, fresh.engram) and bool((g.engram[2:] == -1).all())


def test_steps_the_graphs_were_not_captured_for_run_eagerly() -> None:
    g = _graphs(engram=3)
    assert g.run(_sched(3), _decode_rows(3)) is None  # no Engram history, but the graphs read one
    rows = torch.zeros(2, 1, 1, dtype=torch.int64)  # precomputed rows: not a captured input
    assert g.run(_sched(2), _decode_rows(2), _hook(torch.full((2, 3), -1), rows)) is None
    prefill = [RowSpec([1, 2, 3], 0, 0, [0])]
    assert g.run(_sched(1), prefill, _hook(torch.full((3, 3), -1))) is None  # more tokens than rows
    assert g.run(_sched(5), _decode_rows(5), _hook(torch.full((5, 3), -1))) is None  # no bucket that large
    too_long = _decode_rows(1, blocks=g.max_blocks + 1)
    assert g.run(_sched(1), too_long, _hook(torch.full((1, 3), -1))) is None
    plain = _graphs(engram=0)
    assert plain.run(_sched(1), _decode_rows(1), _hook(torch.full((1, 3), -1))) is None  # V4: no Engram buffer
    assert plain.run(_sched(1), _decode_rows(1)) is not None
    assert plain.steps[1].engram_prev_ids is None
    assert sum(gr.replays for gr in g.graphs.values()) == 0
