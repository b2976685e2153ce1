"""A tensor-parallel sum left for its consumer to finish: every rank's partial, readable where it lies.

Under `V4SERVE_ALLREDUCE=fused` (dist/allreduce.py) a row-parallel projection's partial output (attention's `wo_b`, the
MoE's experts) is written into a buffer every GPU of the group maps (symmetric memory) and the ranks meet at a
barrier; instead of an all-reduce, the op that consumes the sum — the mHC expansion that follows, `ops/mhc.py`
`hc_post` / `hc_post_pre` — reads every rank's partial over NVLink as it loads its input, in rank order, and rounds
the float32 sum to `out_dtype` (what the all-reduce and the cast after it would have given, up to the order of the
additions). No all-reduce launch, and no round trip of the sum through memory.

`PartialSum.parts` are the ranks' partials as tensors of this process (on a GPU, views of the peers' memory; in the
CPU tests, plain tensors standing for them). `total()` is the plain-torch sum, for any consumer without the fused
load; `pointers()` the device table of their addresses that the kernels take.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class PartialSum:
    parts: list[torch.Tensor]  # [T, D] each, rank order; parts[rank] is this rank's own
    out_dtype: torch.dtype  # the sum's dtype (the all-reduce's, or the cast that followed it)
    # the parts' addresses on the device (dist/allreduce.py makes it once per buffer: a step must not copy it from the
    # host, which a CUDA graph's capture forbids); None: made from `parts` on first use (the CPU tests)
    table: torch.Tensor | None = field(default=None, repr=False)

    @property
    def shape(self) -> torch.Size:
        return self.parts[0].shape

    @property
    def device(self) -> torch.device:
        return self.parts[0].device

    def total(self) -> torch.Tensor:
        """The sum in rank order, float32 (float64 for float64 parts), rounded to out_dtype."""
        acc = torch.float64 if self.parts[0].dtype == torch.float64 else torch.float32
        s = self.parts[0].to(acc)
        for p in self.parts[1:]:
            s = s + p.to(acc)
        return s.to(self.out_dtype)

    def pointers(self) -> torch.Tensor:
        """int64 [ranks] on the device: the address of each part's first element (every part contiguous rows)."""
        if self.table is None:
            self.table = torch.tensor([p.data_ptr() for p in self.parts], dtype=torch.int64, device=self.device)
        return self.table

    def fusable(self) -> bool:
        """The kernels read the parts through one row stride: each contiguous, all of one dtype and shape."""
        p0 = self.parts[0]
        return all(p.is_contiguous() and p.dtype == p0.dtype and p.shape == p0.shape for p in self.parts)


def resolve(f: torch.Tensor | PartialSum) -> torch.Tensor:
    """f itself, or the sum a PartialSum stands for (consumers without the fused load)."""
    return f.total() if isinstance(f, PartialSum) else f
