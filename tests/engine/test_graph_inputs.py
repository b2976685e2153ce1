"""The decode graphs' static inputs (engine/graphs.py), without a GPU: which steps may replay a captured graph, and
what lands in the captured buffers (the step's rows, padding routed to the trash slot, V4.1's Engram history). The
graphs themselves are stand-ins here; tests/gpu/test_cuda.py replays real ones against eager steps."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from v4serve.engine.graphs import DecodeGraphs
from v4serve.models.step import RowSpec, build_step

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


def _decode_step(rows: int):
    return build_step([RowSpec([10 + r], 40 + r, r, [r]) for r in range(rows)])


def test_a_decode_step_fills_the_captured_buffers_and_replays_its_bucket() -> None:
    g = _graphs(engram=3)
    step = _decode_step(3)
    step.engram_prev_ids = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, -1]])
    out = g.run(_sched(3), step)
    assert g.graphs[4].replays == 1 and g.graphs[1].replays == 0
    assert torch.equal(out, g.outputs[4][:3])
    assert torch.equal(g.engram[:3], step.engram_prev_ids) and bool((g.engram[3] == -1).all())  # padding: none
    assert g.buf["token_ids"][:3].tolist() == [10, 11, 12] and g.buf["positions"][:3].tolist() == [40, 41, 42]
    assert g.buf["row_slot"].tolist() == [0, 1, 2, TRASH]  # the padded row writes only the trash slot
    captured = g._step(4)
    assert captured.uniform_decode and captured.decoder_trim is False
    assert captured.engram_prev_ids.data_ptr() == g.engram.data_ptr()  # the model reads the static buffer


def test_steps_the_graphs_were_not_captured_for_run_eagerly() -> None:
    g = _graphs(engram=3)
    assert g.run(_sched(3), _decode_step(3)) is None  # no Engram history, but the graphs read one
    step = _decode_step(2)
    step.engram_prev_ids = torch.full((2, 3), -1)
    step.engram_rows = torch.zeros(2, 1, 1, dtype=torch.int64)  # precomputed rows: not a captured input
    assert g.run(_sched(2), step) is None
    prefill = build_step([RowSpec([1, 2, 3], 0, 0, [0])])
    prefill.engram_prev_ids = torch.full((3, 3), -1)
    assert g.run(_sched(1), prefill) is None  # more tokens than rows
    plain = _graphs(engram=0)
    step = _decode_step(1)
    step.engram_prev_ids = torch.full((1, 3), -1)
    assert plain.run(_sched(1), step) is None  # V4 graphs have no Engram buffer
    assert plain.run(_sched(1), _decode_step(1)) is not None
    assert plain._step(1).engram_prev_ids is None
    assert sum(gr.replays for gr in g.graphs.values()) == 0
