"""One step's token masks for the constrained rows, built beside the model step.

The runner submits the fill before it runs the model and collects it before sampling: the masks of all constrained
rows go into one [rows, ceil(V / 32)] int32 bitmask (xgrammar's batch call, which does not hold the GIL), which the
sampler applies with one op. On the GPU the fill runs while the device computes the step; on the CPU it needs a free
core to be hidden. benchmarks/structured_mask.py measures what stays exposed.

The bitmask buffer is reused across steps: the sampler's host sync (the sampled ids) ends every step, so its copy
to the device is complete before the next fill writes into it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import torch
import xgrammar as xgr

from .guided import Guide


def default_threads() -> int:
    """Fill threads: xgrammar's batch call parallelises over rows; leave most cores to the engine."""
    return max(1, min(8, (os.cpu_count() or 2) // 4))


class MaskBuilder:
    """Fills the bitmask of a step's constrained rows in a worker thread."""

    def __init__(self, vocab_size: int, threads: int | None = None) -> None:
        self.vocab_size = vocab_size
        self.batch = xgr.BatchGrammarMatcher(threads or default_threads())
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="v4serve-mask")
        self._buffer = torch.empty(0, 0, dtype=torch.int32)

    def _bitmask(self, rows: int) -> torch.Tensor:
        if self._buffer.shape[0] < rows:
            shape = xgr.get_bitmask_shape(max(rows, 2 * self._buffer.shape[0]), self.vocab_size)
            self._buffer = torch.empty(shape, dtype=torch.int32, pin_memory=torch.cuda.is_available())
        return self._buffer[:rows]

    def submit(self, guides: Sequence[Guide], rows: Sequence[int], batch_size: int,
               ) -> Future[tuple[torch.Tensor, list[int]]]:
        """Masks of `guides` (the sampling batch's rows `rows`, of `batch_size`): (bitmask [len(rows), V/32], rows)."""
        if len(guides) != len(rows) or any(not 0 <= r < batch_size for r in rows):
            raise ValueError("one guide per row, rows within the batch")
        matchers = [g.matcher for g in guides]
        bitmask = self._bitmask(len(matchers))

        def fill() -> tuple[torch.Tensor, list[int]]:
            self.batch.batch_fill_next_token_bitmask(matchers, bitmask)
            return bitmask, list(rows)

        return self.pool.submit(fill)

    def close(self) -> None:
        self.pool.shutdown(wait=False)
