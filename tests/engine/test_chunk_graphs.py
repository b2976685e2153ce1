"""The chunk graphs' static inputs and their engine path (engine/chunk_graphs.py), without a GPU: which steps may
replay a captured graph of their token bucket, what lands in the captured buffers (the step's rows first, then the
padding row to the trash slot and empty rows; logits indices padded), and that an engine whose prompt steps go
through the stand-ins (eager forwards over the same static buffers) generates what an eager engine does.
tests/gpu/test_cuda.py replays real graphs against eager steps."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from v4serve import LLM, SamplingParams
from v4serve.engine.chunk_graphs import ChunkGraphs
from v4serve.models.step import RowSpec

from .common import ENGINE
from .test_graph_inputs import TRASH, _Graph  # a captured graph's stand-in that counts its replays

def _graphs(engram: int = 0, rows: int = 4, trimmed: bool = False) -> ChunkGraphs:
    g = ChunkGraphs(None, SimpleNamespace(trash_slot=TRASH), (8, 16), rows, 256, 8, 64, torch.device("cpu"), engram,
                    trimmed=trimmed)
    for b in g.sizes:
        g.graphs[b] = _Graph()
        g.outputs[b] = torch.arange(rows * 3, dtype=torch.float32).view(rows, 3) + 100 * b[0] + 10 * b[1]
    return g


def _sched(rows: int, prompt_logprobs=None) -> SimpleNamespace:
    req = SimpleNamespace(request=SimpleNamespace(params=SimpleNamespace(prompt_logprobs=prompt_logprobs)))
    return SimpleNamespace(rows=[req] * rows)


def _hook(prev: torch.Tensor | None = None):
    def hook(sched, step) -> None:
        step.engram_prev_ids = prev
    return hook


def _mixed_rows() -> list[RowSpec]:
    """A decode row, then a 6-token prompt chunk that samples (its last chunk) and a 2-token one that does not."""
    return [RowSpec([10], 40, 0, [100]),
            RowSpec([20, 21, 22, 23, 24, 25], 0, 1, [200, 201]),
            RowSpec([30, 31], 64, 2, [300, 301, 302], logits="none")]


def test_a_mixed_step_fills_its_token_bucket_and_returns_its_logits_rows() -> None:
    g = _graphs(engram=3)
    prev = torch.arange(27).view(9, 3)
    out = g.run(_sched(3), _mixed_rows(), _hook(prev))
    assert g.graphs[16, 0].replays == 1 and g.graphs[8, 0].replays == 0  # 9 tokens: the 16-token bucket
    assert torch.equal(out, g.outputs[16, 0][:2])  # the two rows that sample
    step = g.steps[16, 0]  # what the captured graph reads
    assert step.num_tokens == 16 and step.num_rows == 4
    assert step.token_ids.tolist() == [10, 20, 21, 22, 23, 24, 25, 30, 31] + [0] * 7
    assert step.positions.tolist() == [40, 0, 1, 2, 3, 4, 5, 64, 65] + list(range(7))
    assert step.token_row.tolist() == [0] + [1] * 6 + [2] * 2 + [3] * 7
    assert step.row_slot.tolist() == [0, 1, 2, TRASH]  # the padding row writes only the trash slot
    assert step.row_start.tolist() == [40, 0, 64, 0] and step.row_len.tolist() == [1, 6, 2, 7]
    assert step.row_offset.tolist() == [0, 1, 7, 9]
    assert step.logits_index.tolist() == [0, 6, 0, 0]  # the sampling rows' last tokens, then padding
    assert step.block_table[:, :3].tolist() == [[100, -1, -1], [200, 201, -1], [300, 301, 302], [-1, -1, -1]]
    assert bool((step.block_table[:, 3:] == -1).all())
    assert not step.uniform_decode and not step.one_token_rows and step.decoder_trim is False
    assert step.max_context == 256 and step.decoder_step is None
    assert torch.equal(g.engram[:9], prev) and bool((g.engram[9:16] == -1).all())  # padding tokens: no history


def test_empty_rows_follow_the_padding_row() -> None:
    g = _graphs(rows=6)
    g.run(_sched(1), [RowSpec([5, 6, 7], 0, 1, [9])], _hook())
    step = g.steps[8, 0]
    assert step.row_len.tolist() == [3, 5, 0, 0, 0, 0] and step.row_offset.tolist() == [0, 3, 8, 8, 8, 8]
    assert step.row_slot.tolist() == [1] + [TRASH] * 5 and step.logits_index.tolist() == [2] + [0] * 5


def test_the_buffers_forget_an_earlier_step() -> None:
    g = _graphs(engram=3)
    g.run(_sched(3), _mixed_rows(), _hook(torch.ones(9, 3, dtype=torch.int64)))
    small = [RowSpec([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 0, 1, [50])]
    g.run(_sched(1), small, _hook(torch.zeros(10, 3, dtype=torch.int64)))
    fresh = _graphs(engram=3)
    fresh.run(_sched(1), small, _hook(torch.zeros(10, 3, dtype=torch.int64)))
    for name in ("token_ids", "positions", "token_row", "row_slot", "row_start", "row_len", "row_offset",
                 "window_floor", "cached_len", "decoder_floor", "logits_index", "block_table"):
        assert torch.equal(getattr(g.steps[16, 0], name), getattr(fresh.steps[16, 0], name)), name
    assert torch.equal(g.engram, fresh.engram)


def _trimmed_rows() -> list[RowSpec]:
    """A decode row (floor 0), a prompt chunk of 6 tokens from position 60 whose decoder floor is 63 (the decoder
    layers compute its last 3) and a replayed chunk wholly below its floor (no logits)."""
    return [RowSpec([10], 40, 0, [100]),
            RowSpec([20, 21, 22, 23, 24, 25], 60, 1, [200, 201], window_floor=50, cached_len=48, decoder_floor=63),
            RowSpec([30, 31], 64, 2, [300], decoder_floor=80, logits="none")]


def test_a_trimmed_step_packs_its_decoder_sub_step_and_kept_tokens() -> None:
    """V4.1's bounded replay: the decoder sub-step (each row's suffix from its decoder floor, window floor raised
    to it — restrict_to_suffix's, made on the host) and the kept tokens' flat indices land in the (T, K) bucket's
    second buffer; the whole step's padding token (index T - 1) pads the kept indices."""
    g = _graphs(trimmed=True)
    assert g.sizes == [(8, 0), (8, 8), (16, 0), (16, 8), (16, 16)]
    out = g.run(_sched(3), _trimmed_rows(), _hook())
    assert g.graphs[16, 8].replays == 1 and sum(x.replays for x in g.graphs.values()) == 1  # 9 tokens, 4 kept
    assert torch.equal(out, g.outputs[16, 8][:2])
    step = g.steps[16, 8]
    assert step.token_ids.tolist()[:9] == [10, 20, 21, 22, 23, 24, 25, 30, 31]
    sub, kept = step.decoder_step, step.decoder_kept
    assert kept.tolist() == [0, 4, 5, 6, 15, 15, 15, 15]
    assert sub.token_ids.tolist() == [10, 23, 24, 25, 0, 0, 0, 0] and sub.positions.tolist() == [40, 63, 64, 65,
                                                                                                  0, 1, 2, 3]
    assert sub.row_start.tolist() == [40, 63, 66, 0] and sub.row_len.tolist() == [1, 3, 0, 4]
    assert sub.window_floor.tolist() == [0, 63, 80, 0] and sub.cached_len.tolist() == [0, 48, 0, 0]
    assert sub.row_slot.tolist() == [0, 1, 2, TRASH] and sub.logits_index.tolist() == [0, 3, 0, 0]
    assert sub.block_table.data_ptr() == step.block_table.data_ptr()  # the rows' blocks: the whole step's table
    # what the eager path computes on the device for the same rows
    from v4serve.models.step import build_step

    eager = build_step(_trimmed_rows())
    ref, ref_kept = eager.restrict_to_suffix(eager.decoder_floor)
    assert ref_kept.tolist() == kept.tolist()[:4]
    for name in ("token_ids", "positions", "token_row"):
        assert getattr(ref, name).tolist() == getattr(sub, name).tolist()[:4], name
    for name in ("row_start", "row_len", "row_offset", "window_floor", "cached_len", "decoder_floor", "row_slot"):
        assert getattr(ref, name).tolist() == getattr(sub, name).tolist()[:3], name
    assert ref.logits_index.tolist() == sub.logits_index.tolist()[:2]


def test_trimmed_steps_without_trimmed_buckets_or_with_logits_below_the_floor_run_eagerly() -> None:
    assert _graphs(trimmed=False).prepare(_sched(3), _trimmed_rows(), _hook()) is None
    rows = _trimmed_rows()
    rows[1].decoder_floor = 70  # the row samples its last token, below the floor: the eager step raises
    assert _graphs(trimmed=True).prepare(_sched(3), rows, _hook()) is None
    big = [RowSpec(list(range(16)), 60, 1, [9], decoder_floor=70)]  # a trimmed step needs a padding token: T < 16
    assert _graphs(trimmed=True).prepare(_sched(1), big, _hook()) is None


@pytest.mark.parametrize("case", ["too many tokens", "prompt logprobs", "all logits", "decoder trim", "rows"])
def test_steps_the_graphs_do_not_take(case: str) -> None:
    g = _graphs()
    rows = _mixed_rows()
    sched = _sched(3)
    if case == "too many tokens":
        rows = [RowSpec(list(range(17)), 0, 1, [9])]
        sched = _sched(1)
    elif case == "prompt logprobs":
        sched = _sched(3, prompt_logprobs=2)
    elif case == "all logits":
        rows[1].logits = "all"
    elif case == "decoder trim":  # V4.1's bounded replay: the decoder layers run on a data-dependent suffix
        rows[1].decoder_floor = 3
    else:  # a step of every bucket row leaves none for the padding
        rows = [RowSpec([r], 5, r, [r]) for r in range(4)]
        sched = _sched(4)
    assert g.prepare(sched, rows, _hook()) is None
    assert all(gr.replays == 0 for gr in g.graphs.values())


# --- the engine path: prompt steps through the stand-ins --------------------------------------------------------

def _prompts(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    shared = [rng.randrange(1000, 100000) for _ in range(40)]
    return [[rng.randrange(1000, 100000) for _ in range(n)] for n in (5, 37, 70)] + [shared + [7, 8, 9], shared]


def _generate(preset: str, chunk_tokens: tuple[int, ...], **kw) -> tuple[list[list[int]], LLM]:
    llm = LLM(preset, block_size=32, max_num_seqs=4, max_num_batched_tokens=48, graph_stand_ins=True,
              cuda_graph_sizes=(1, 2, 4), chunk_graph_tokens=chunk_tokens, **kw, **ENGINE)
    sp = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    return [o.token_ids for o in llm.generate(_prompts(3), sp)], llm


@pytest.mark.parametrize("preset,kw", [("tiny-v4-flash", {}),
                                       ("tiny-v41-flash", {"swa_bounded_replay": False}),
                                       ("tiny-v41-flash", {})])
def test_prompt_steps_through_the_chunk_graphs_generate_what_eager_steps_do(preset: str, kw: dict) -> None:
    """Chunked prompts (48-token steps over 5 requests, some beside decode rows, a prefix hit) through token buckets
    of 16 / 32 / 64: the same tokens as without chunk graphs. V4.1 with bounded replay: its trimmed steps too, through
    the (T, K) buckets."""
    expected, _ = _generate(preset, (), **kw)
    got, llm = _generate(preset, (16, 32, 64), **kw)
    assert got == expected
    g = llm.engine.runner.chunk_graphs
    assert g.replays > 0
    assert g.trimmed == (preset == "tiny-v41-flash" and not kw)
    if g.trimmed:
        assert any(n for b, n in g.replayed.items() if b[1]), "no trimmed step was replayed"


class _NoHostReads(TorchDispatchMode):
    """Fails on any op that reads a tensor's values on the host (a sync on a GPU, not capturable in a graph)."""

    READS = {"aten::_local_scalar_dense", "aten::item", "aten::is_nonzero", "aten::nonzero", "aten::nonzero_numpy",
             "aten::nonzero_static", "aten::equal", "aten::_unique2", "aten::unique_dim", "aten::unique_consecutive",
             "aten::masked_select", "aten::repeat_interleave"}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func._schema.name in self.READS:
            raise AssertionError(f"host read of a tensor's values in a captured step: {func._schema.name}")
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("preset,bucket", [("tiny-v4-flash", (32, 0)), ("tiny-v41-flash", (32, 32))])
def test_a_chunk_step_on_the_kernels_reads_nothing_on_the_host(preset: str, bucket: tuple[int, int]) -> None:
    """The forward a chunk graph captures — the Triton kernels' path, as on a GPU — makes no host read of device
    values and no data-sized op (a sync: graph capture fails on it). (The reference MoE's CPU body loops over the
    experts hit, so only the kernels' path is checked here.) V4.1 with bounded replay: a trimmed bucket's step, the
    decoder layers on the sub-step prepared on the host."""
    llm = LLM(preset, block_size=32, max_num_seqs=1, max_num_batched_tokens=32, graph_stand_ins=True,
              cuda_graph_sizes=(1,), chunk_graph_tokens=(32,), kernels="triton", dtype="bfloat16", device="cpu")
    g = llm.engine.runner.chunk_graphs  # its static step: the padding row of 32 tokens, a prompt chunk's kernels
    with pytest.raises(AssertionError, match="host read"), _NoHostReads():  # the check sees a sync
        bool(g.steps[bucket].row_len.any())
    with torch.inference_mode(), _NoHostReads():
        g.model(g.steps[bucket], g.pools)
