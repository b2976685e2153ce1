"""CUDA graphs for uniform decode steps (every row one token, no prompt logprobs).

One graph per batch-size bucket, captured at startup over a static packed input buffer (models/step.py StepLayout:
T = R = L = the bucket, the block table max_model_len / block_size wide). A step with R decode rows runs the smallest
bucket >= R: its rows, padded to the bucket with rows that point at the trash slot and no blocks (they read and write
nothing that matters), are packed on the host and copied in one non-blocking copy (two with the block table's used
columns). Compressed gathers are sized by max_model_len, so one graph serves every context length. Sampling runs after
the replay.

Under tensor parallelism every rank captures the same buckets in the same order (the warm-up forwards and the capture
contain the ranks' all-reduces, so they must line up), and each step rank 0 prepares the packed inputs once
(`prepare`) and sends them to the workers, which load them into their own static buffers and replay their own graph
(`replay`): the captured collectives then meet as the eager ones do. `stand_ins=True` replaces the CUDA graphs by
eager forwards over the same static buffers (CPU tests of this path: there are no graphs on the CPU).
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass, replace

import torch

from ..cache.pool import KVPools
from ..dist.parallel import dep_step
from ..models.step import RowSpec, StepInput, StepLayout, pack_step
from ..transfer import staged

log = logging.getLogger("v4serve.graphs")

# Under TP and DEP the decode graphs (collectives captured inside) are opt-in on GPUs until their two-GPU test
# (tests/dist/test_engine_tp.py / test_engine_dp.py -k two_gpus) has run: V4SERVE_MULTI_RANK_GRAPHS=1 turns them on
MULTI_RANK_DEFAULT = False


def multi_rank_graphs() -> bool:
    v = os.environ.get("V4SERVE_MULTI_RANK_GRAPHS")
    return MULTI_RANK_DEFAULT if v is None else v not in ("0", "")


class DecodeGraphs:
    KIND = "decode"  # (the log line) buckets: batch sizes

    def __init__(self, model: torch.nn.Module, pools: KVPools, sizes: tuple[int, ...], max_model_len: int,
                 num_blocks: int, block_size: int, device: torch.device,
                 engram_lookback: int = 0, stand_ins: bool = False, thread_local: bool = False,
                 data_parallel: bool = False):
        """`engram_lookback`: V4.1's Engram n-gram history per token (`StepInput.engram_prev_ids`, 0 = none), captured
        as a static buffer padded with -1. `stand_ins`: eager forwards instead of CUDA graphs (see above).
        `thread_local`: capture in CUDA's thread-local mode (tensor parallelism: NCCL's watchdog thread queries events
        while this thread captures). `data_parallel` (DEP): each bucket's graph is captured with the MoE exchanges
        padded to the bucket (every rank replays the same bucket, an idle rank one of padding rows only)."""
        self.model, self.pools, self.device = model, pools, device
        self.stand_ins, self.thread_local, self.data_parallel = stand_ins, thread_local, data_parallel
        self.max_model_len = max_model_len
        self.sizes = self.buckets(sizes)
        self.max_blocks = -(-max_model_len // block_size)
        self.pad = RowSpec([0], 0, pools.trash_slot, [])
        n = max(self.tokens(b) for b in self.sizes)
        self.engram = torch.full((n, engram_lookback), -1, dtype=torch.int64, device=device) if engram_lookback else None
        self.static: dict = {}  # bucket -> its packed input buffer
        self.tails: dict = {}  # bucket -> a second static buffer (chunk graphs: the decoder sub-step's inputs)
        self.steps: dict = {}  # bucket -> the StepInput the graph was captured with (views of static)
        self.width: dict = {}  # bucket -> block-table columns that may hold blocks (the rest are -1)
        for b in self.sizes:
            packed, layout = self.static_layout(b)
            self.static[b] = packed.to(device)
            self.width[b] = 0
            self.steps[b] = replace(layout.unpack(self.static[b], max_model_len), uniform_decode=layout.one_token_rows,
                                    decoder_trim=False,
                                    engram_prev_ids=self.engram[:layout.tokens] if self.engram is not None else None)
            self.add_static(b)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.pool = None
        self.replayed: dict = {}  # bucket -> its replays

    @property
    def replays(self) -> int:
        return sum(self.replayed.values())

    @staticmethod
    def buckets(sizes) -> list:
        return sorted(s for s in sizes if s >= 1)

    @staticmethod
    def tokens(bucket) -> int:
        """A bucket's tokens."""
        return bucket

    def static_layout(self, bucket) -> tuple[torch.Tensor, StepLayout]:
        """A bucket's static step, packed: T = R = L = the bucket, padding rows only, the table max_blocks wide."""
        return pack_step([self.pad] * bucket, width=self.max_blocks)

    def add_static(self, bucket) -> None:
        """More static inputs of a bucket's step (chunk graphs: the decoder sub-step of a trimmed bucket)."""

    @torch.inference_mode()
    def capture(self) -> None:
        if self.stand_ins:
            for b in sorted(self.sizes, reverse=True):
                self.graphs[b] = _StandIn(self, b)
                with self.exchange(b):
                    self.outputs[b] = self.model(self.steps[b], self.pools).logits
            return
        mode = "thread_local" if self.thread_local else "global"
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for b in sorted(self.sizes, reverse=True):
                step = self.steps[b]
                with self.exchange(b):
                    for _ in range(2):  # warm up lazily-initialised kernels and caches
                        self.model(step, self.pools)
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g, pool=self.pool, stream=stream, capture_error_mode=mode):
                        self.outputs[b] = self.model(step, self.pools).logits
                self.pool = g.pool()
                self.graphs[b] = g
        torch.cuda.current_stream(self.device).wait_stream(stream)
        torch.cuda.synchronize(self.device)
        log.info("captured %s CUDA graphs for buckets %s", self.KIND, self.sizes)

    def exchange(self, bucket: int):
        """DEP: the forward of a bucket pads its MoE exchanges to the bucket (dist/parallel.dep_step)."""
        return dep_step(bucket) if self.data_parallel else contextlib.nullcontext()

    def bucket(self, rows: int) -> int | None:
        return next((s for s in self.sizes if s >= rows), None)

    def run(self, sched, rows: list[RowSpec], step_hook=None, patch=None) -> torch.Tensor | None:
        """Replay the graph for a uniform decode step of these rows (`step_hook(sched, step)` sets the model-specific
        inputs, as for eager steps; `patch(step)` changes the copied inputs on the device before the replay: async
        scheduling's pending tokens); None when the step does not qualify."""
        inp = self.prepare(sched, rows, step_hook)
        return None if inp is None else self.replay(inp, patch)

    def prepare(self, sched, rows: list[RowSpec], step_hook=None, bucket: int | None = None,
                width: dict[int, int] | None = None) -> GraphInput | None:
        """The host side of a replay: the bucket and the packed inputs (None when the step does not qualify).
        DEP: rank 0 prepares every rank's inputs for one `bucket` (a rank without rows: padding only), tracking each
        other rank's block-table `width` itself (default: this rank's own)."""
        R = len(rows)
        if any(len(r.token_ids) != 1 or r.logits != "last" for r in rows) \
                or any(r.request.params.prompt_logprobs is not None for r in sched.rows):
            return None
        b, widest = bucket or self.bucket(R), max((len(r.blocks) for r in rows), default=0)
        if b is None or R > b or widest > self.max_blocks:
            return None
        extras = self.hook_inputs(sched, step_hook, b, R > 0)
        if extras is None:
            return None
        # the table's columns that may hold blocks: this step's, and -1 over any an earlier step used
        used = max(widest, (self.width if width is None else width)[b])
        packed, layout = pack_step(rows + [self.pad] * (b - R), width=used)
        return GraphInput(b, R, packed, layout.flat, used, widest, extras.engram_prev_ids)

    def hook_inputs(self, sched, step_hook, bucket, has_rows: bool) -> StepInput | None:
        """What the step hook adds for the step's own rows (V4.1: their Engram history; a DEP rank without rows: an
        empty one), on a copy of the bucket's step; None when those are inputs the graphs were not captured with."""
        extras = replace(self.steps[bucket], engram_prev_ids=None)
        if step_hook is not None and has_rows:
            step_hook(sched, extras)
        elif not has_rows and self.engram is not None:
            extras.engram_prev_ids = self.engram.new_empty(0, self.engram.shape[1])
        if extras.engram_rows is not None or (extras.engram_prev_ids is None) != (self.engram is None):
            return None
        return extras

    def replay(self, inp: GraphInput, patch=None) -> torch.Tensor:
        """Load the inputs into the bucket's static buffers and replay its graph: the logits of the step's rows. (A
        tensor-parallel worker calls this with rank 0's GraphInput; its width bookkeeping follows rank 0's.)"""
        b, R = inp.bucket, inp.rows
        packed = staged(inp.packed, self.device)
        static, step = self.static[b], self.steps[b]
        static[:inp.flat].copy_(packed[:inp.flat], non_blocking=True)  # the bucket's layout
        if inp.used:
            step.block_table[:, :inp.used].copy_(packed[inp.flat:].view(step.num_rows, inp.used), non_blocking=True)
        self.width[b] = inp.widest
        if inp.tail is not None:
            self.tails[b].copy_(staged(inp.tail, self.device), non_blocking=True)
        if self.engram is not None:  # the step's tokens' n-gram history, -1 for the padding tokens
            n = inp.engram_prev_ids.shape[0]
            self.engram[:n].copy_(inp.engram_prev_ids, non_blocking=True)
            if n < self.steps[b].num_tokens:
                self.engram[n:self.steps[b].num_tokens].fill_(-1)
        if patch is not None:
            patch(step)
        self.graphs[b].replay()
        self.replayed[b] = self.replayed.get(b, 0) + 1
        return self.outputs[b][:R]


@dataclass
class GraphInput:
    """One graphed step's inputs, prepared on the host: what the tensor-parallel workers receive in place of a
    StepInput."""
    bucket: int | tuple[int, int]  # decode graphs: rows; chunk graphs: (tokens, decoder tokens)
    rows: int  # the step's logits rows (decode: its rows; the rest of the bucket is padding)
    packed: torch.Tensor  # pack_step's host buffer: the flat fields, then the block table's `used` columns
    flat: int
    used: int
    widest: int
    engram_prev_ids: torch.Tensor | None
    tail: torch.Tensor | None = None  # the bucket's second static buffer's contents (ChunkGraphs: the decoder's)


class _StandIn:
    """A captured graph's stand-in (stand_ins=True): replay runs the forward over the bucket's static buffers eagerly
    and leaves its logits where the graph's would be."""

    def __init__(self, graphs: DecodeGraphs, bucket: int) -> None:
        self.graphs, self.bucket = graphs, bucket

    def replay(self) -> None:
        g = self.graphs
        with g.exchange(self.bucket):
            g.outputs[self.bucket].copy_(g.model(g.steps[self.bucket], g.pools).logits)
