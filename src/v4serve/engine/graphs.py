"""CUDA graphs for uniform decode steps (every row one token, no prompt logprobs).

One graph per batch-size bucket, captured at startup over a static packed input buffer (models/step.py StepLayout:
T = R = L = the bucket, the block table max_model_len / block_size wide). A step with R decode rows runs the smallest
bucket >= R: its rows, padded to the bucket with rows that point at the trash slot and no blocks (they read and write
nothing that matters), are packed on the host and copied in one non-blocking copy (two with the block table's used
columns). Compressed gathers are sized by max_model_len, so one graph serves every context length. Sampling runs after
the replay.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import torch

from ..cache.pool import KVPools
from ..models.step import RowSpec, StepInput, pack_step
from ..transfer import staged

log = logging.getLogger("v4serve.graphs")


class DecodeGraphs:
    def __init__(self, model: torch.nn.Module, pools: KVPools, sizes: tuple[int, ...], max_model_len: int,
                 num_blocks: int, block_size: int, device: torch.device,
                 engram_lookback: int = 0):
        """`engram_lookback`: V4.1's Engram n-gram history per token (`StepInput.engram_prev_ids`, 0 = none), captured
        as a static buffer padded with -1."""
        self.model, self.pools, self.device = model, pools, device
        self.max_model_len = max_model_len
        self.sizes = sorted(s for s in sizes if s >= 1)
        self.max_blocks = -(-max_model_len // block_size)
        self.pad = RowSpec([0], 0, pools.trash_slot, [])
        n = max(self.sizes)
        self.engram = torch.full((n, engram_lookback), -1, dtype=torch.int64, device=device) if engram_lookback else None
        self.static: dict[int, torch.Tensor] = {}  # bucket -> its packed input buffer
        self.steps: dict[int, StepInput] = {}  # bucket -> the StepInput the graph was captured with (views of static)
        self.width: dict[int, int] = {}  # bucket -> block-table columns that may hold blocks (the rest are -1)
        for b in self.sizes:
            packed, layout = pack_step([self.pad] * b, width=self.max_blocks)
            self.static[b] = packed.to(device)
            self.width[b] = 0
            self.steps[b] = replace(layout.unpack(self.static[b], max_model_len), uniform_decode=True,
                                    decoder_trim=False,
                                    engram_prev_ids=self.engram[:b] if self.engram is not None else None)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.pool = None
        self.replays = 0

    @torch.inference_mode()
    def capture(self) -> None:
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for b in sorted(self.sizes, reverse=True):
                step = self.steps[b]
                for _ in range(2):  # warm up lazily-initialised kernels and caches
                    self.model(step, self.pools)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=self.pool, stream=stream):
                    self.outputs[b] = self.model(step, self.pools).logits
                self.pool = g.pool()
                self.graphs[b] = g
        torch.cuda.current_stream(self.device).wait_stream(stream)
        torch.cuda.synchronize(self.device)
        log.info("captured decode CUDA graphs for batch sizes %s", self.sizes)

    def bucket(self, rows: int) -> int | None:
        return next((s for s in self.sizes if s >= rows), None)

    def run(self, sched, rows: list[RowSpec], step_hook=None, patch=None) -> torch.Tensor | None:
        """Replay the graph for a uniform decode step of these rows (`step_hook(sched, step)` sets the model-specific
        inputs, as for eager steps; `patch(step)` changes the copied inputs on the device before the replay: async
        scheduling's pending tokens); None when the step does not qualify."""
        R = len(rows)
        if any(len(r.token_ids) != 1 or r.logits != "last" for r in rows) \
                or any(r.request.params.prompt_logprobs is not None for r in sched.rows):
            return None
        b, widest = self.bucket(R), max(len(r.blocks) for r in rows)
        if b is None or widest > self.max_blocks:
            return None
        extras = replace(self.steps[b], engram_prev_ids=None)  # what the hook adds, for the first R rows
        if step_hook is not None:
            step_hook(sched, extras)
        if extras.engram_rows is not None or (extras.engram_prev_ids is None) != (self.engram is None):
            return None  # inputs the graphs were not captured with
        # the table's columns that may hold blocks: this step's, and -1 over any an earlier step used
        used = max(widest, self.width[b])
        packed, layout = pack_step(rows + [self.pad] * (b - R), width=used)
        packed = staged(packed, self.device)
        static, step = self.static[b], self.steps[b]
        static[:layout.flat].copy_(packed[:layout.flat], non_blocking=True)  # same layout: T = R = L = b
        if used:
            step.block_table[:, :used].copy_(packed[layout.flat:].view(b, used), non_blocking=True)
        self.width[b] = widest
        if self.engram is not None:
            self.engram[:R].copy_(extras.engram_prev_ids, non_blocking=True)
            if R < b:
                self.engram[R:b].fill_(-1)
        if patch is not None:
            patch(step)
        self.graphs[b].replay()
        self.replays += 1
        return self.outputs[b][:R]
