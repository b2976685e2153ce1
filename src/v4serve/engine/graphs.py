"""CUDA graphs for uniform decode steps (every row one token, no prompt logprobs).

One graph per batch-size bucket, captured at startup over static input buffers. A step with R decode rows runs the
smallest bucket >= R: the real rows are copied into the buffers (pinned host -> device, non-blocking) and the
padding rows point at the trash slot and trash blocks, so they read and write nothing that matters. Compressed
gathers are sized by max_model_len, so one graph serves every context length. Sampling runs after the replay.
"""

from __future__ import annotations

import logging

import torch

from ..cache.pool import KVPools
from ..models.step import StepInput

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
        n = max(self.sizes)
        i64 = dict(dtype=torch.int64, device=device)
        self.buf = {
            "token_ids": torch.zeros(n, **i64), "positions": torch.zeros(n, **i64),
            "row_slot": torch.full((n,), pools.trash_slot, **i64), "block_table": torch.full((n, self.max_blocks), -1, **i64),
            "window_floor": torch.zeros(n, **i64), "cached_len": torch.zeros(n, **i64),
            "decoder_floor": torch.zeros(n, **i64),
        }
        self.engram = torch.full((n, engram_lookback), -1, **i64) if engram_lookback else None
        self.arange = torch.arange(n, **i64)
        self.ones = torch.ones(n, **i64)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.pool = None
        self.replays = 0

    def _step(self, b: int) -> StepInput:
        f = self.buf
        return StepInput(
            token_ids=f["token_ids"][:b], positions=f["positions"][:b], token_row=self.arange[:b],
            row_slot=f["row_slot"][:b], row_start=f["positions"][:b], row_len=self.ones[:b],
            row_offset=self.arange[:b], block_table=f["block_table"][:b], window_floor=f["window_floor"][:b],
            cached_len=f["cached_len"][:b], decoder_floor=f["decoder_floor"][:b], logits_index=self.arange[:b],
            max_context=self.max_model_len,
            uniform_decode=True, decoder_trim=False,
            engram_prev_ids=self.engram[:b] if self.engram is not None else None)

    @torch.inference_mode()
    def capture(self) -> None:
        self._reset_padding(max(self.sizes))
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for b in sorted(self.sizes, reverse=True):
                step = self._step(b)
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

    def _reset_padding(self, b: int) -> None:
        f = self.buf
        f["token_ids"][:b] = 0
        f["positions"][:b] = 0
        f["row_slot"][:b] = self.pools.trash_slot
        f["block_table"][:b] = -1
        f["window_floor"][:b] = 0
        f["cached_len"][:b] = 0
        f["decoder_floor"][:b] = 0
        if self.engram is not None:
            self.engram[:b] = -1

    def bucket(self, rows: int) -> int | None:
        return next((s for s in self.sizes if s >= rows), None)

    def run(self, sched, step: StepInput) -> torch.Tensor | None:
        """Replay the graph for a uniform decode step; None when the step does not qualify."""
        R = step.num_rows
        if step.num_tokens != R or any(r.request.params.prompt_logprobs is not None for r in sched.rows):
            return None
        if step.engram_rows is not None or (step.engram_prev_ids is None) != (self.engram is None):
            return None  # inputs the graphs were not captured with
        b = self.bucket(R)
        if b is None or step.block_table.shape[1] > self.max_blocks:
            return None
        f = self.buf
        self._reset_padding(b)
        f["token_ids"][:R].copy_(step.token_ids, non_blocking=True)
        f["positions"][:R].copy_(step.positions, non_blocking=True)
        f["row_slot"][:R].copy_(step.row_slot, non_blocking=True)
        f["block_table"][:R, : step.block_table.shape[1]].copy_(step.block_table, non_blocking=True)
        f["window_floor"][:R].copy_(step.window_floor, non_blocking=True)
        f["cached_len"][:R].copy_(step.cached_len, non_blocking=True)
        f["decoder_floor"][:R].copy_(step.decoder_floor, non_blocking=True)
        if self.engram is not None:
            self.engram[:R].copy_(step.engram_prev_ids, non_blocking=True)
        self.graphs[b].replay()
        self.replays += 1
        return self.outputs[b][:R]
