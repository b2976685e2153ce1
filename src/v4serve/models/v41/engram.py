"""Engram (DeepSeek-V4.1 layers 1 and 14): a hashed n-gram memory written into the residual streams.

For each token the layer gathers its 24 table rows (see engram_hash.py), concatenates them [24 * 256] and
projects with `wkv` to one key per stream [hc, dim] plus one shared value [dim]. Per (token, stream k):

    dot_k  = sum_d X_k,d * q_weight_k,d * k_weight_k,d * key_k,d * rsqrt(mean(X_k^2) + eps)
             * rsqrt(mean(key_k^2) + eps) * dim^-0.5
    gate_k = sigmoid(sign(dot_k) * sqrt(max(|dot_k|, 1e-6)))
    X_k   <- X_k + gate_k * value                                  (gate 0 for dead tokens: image placeholders)

(ops/engram.py `engram_mix`: one launch on the Triton path.)

The tables are large (~98 GB FP8 each for V4.1-Flash) and only 24 rows per token are read, so `EngramTable`
keeps the stored FP8 rows with their per-32 e8m0 scales (never a dequantized copy) and can live in host memory
(pinned): a step then gathers its rows on the host and copies only those to the device.

Under tensor parallelism each rank holds a contiguous share of every table's rows (models/sharding.py `row_share`):
it gathers the rows it owns, zeros for the others, and the ranks sum the gathered rows (one all-reduce per layer).
"""

from __future__ import annotations

import torch
from torch import nn

from ...config import ModelConfig
from ...dist import parallel
from ...ops import backend as kernels
from ...ops import quant
from ...ops.engram import engram_mix
from ...ops.linear import Linear, scale_bytes
from ...ops.precision import wide
from ...ops.shard import VOCAB
from ..sharding import row_share
from ..v4.modules import param


class EngramTable(nn.Module):
    """`engram.embed`: rows [N, head_dim] stored FP8 e4m3 + e8m0 scale bytes [N, head_dim/32], or floats.

    `set_stored` is how the loader hands over a checkpoint tensor (kept in its stored format);
    `place(on_host=...)` moves the table between device and (pinned) host memory.
    """

    keeps_stored_format = True

    def __init__(self, rows: int, head_dim: int, on_host: bool = False, first: int = 0, total: int | None = None):
        super().__init__()
        self.rows, self.head_dim, self.on_host = rows, head_dim, on_host
        self.first = first  # TP: the global id of local row 0; rows outside [first, first + rows) read as zeros
        self.total = rows if total is None else total
        self.register_buffer("weight", torch.zeros(0, head_dim), persistent=False)
        self.register_buffer("scale", None, persistent=False)

    def set_stored(self, tensor: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> None:
        if tuple(tensor.shape) != (self.rows, self.head_dim):
            raise ValueError(f"Engram table of shape {list(tensor.shape)} does not fit [{self.rows}, {self.head_dim}]")
        if tensor.dtype == torch.float8_e4m3fn:
            if scale is None:
                raise ValueError("an FP8 Engram table needs its per-32 scales")
            self.weight = tensor
            self.scale = scale_bytes(scale)  # e8m0 exponent bytes (uint8), widened per gathered row
        else:
            self.weight, self.scale = tensor, None  # kept as stored; rows widen per gather
        if self.on_host:
            self.place(True)

    def place(self, on_host: bool, pin: bool = True, device: torch.device | str | None = None) -> None:
        """Move the table to (pinned) host memory, or to `device`."""
        self.on_host = on_host
        if on_host:
            def move(t: torch.Tensor) -> torch.Tensor:
                t = t.to("cpu")
                return t.pin_memory() if pin and torch.cuda.is_available() and not t.is_pinned() else t
        else:
            def move(t: torch.Tensor) -> torch.Tensor:
                return t.to(device)
        self.weight = move(self.weight)
        if self.scale is not None:
            self.scale = move(self.scale)

    def forward(self, rows: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
        """rows [...] int64 (any device) -> dequantized rows [..., head_dim] on rows' device."""
        dev = rows.device
        host = self.weight.device != dev
        idx = rows.to(self.weight.device) if host else rows
        mine = None
        if self.rows != self.total:  # a TP share: other ranks' rows gather row 0, then weigh zero
            idx = idx - self.first
            mine = (idx >= 0) & (idx < self.rows)
            idx = idx.clamp(0, max(self.rows - 1, 0))
        vals = self.weight[idx]
        sc = self.scale[idx] if self.scale is not None else None
        if host:  # gather on the host, ship only the rows this step reads
            vals = vals.to(dev, non_blocking=True)
            sc = sc.to(dev, non_blocking=True) if sc is not None else None
        if sc is not None:
            sc = quant.e8m0_to_float(sc) if sc.dtype == torch.uint8 else sc.float()
            vals = (vals.float().unflatten(-1, (-1, 32)) * sc.unsqueeze(-1)).flatten(-2)
        vals = vals.to(out_dtype)
        if mine is not None:
            vals = vals * mine.to(dev).unsqueeze(-1).to(out_dtype)
        return vals


class Engram(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, table_on_host: bool = False):
        super().__init__()
        c = config
        self.config = c
        self.index = c.engram_layers.index(layer)  # which of the hasher's layers this is
        self.columns = (c.engram_max_ngram - 1) * c.engram_n_heads
        self.tp = tp = parallel.current()
        total = c.engram_num_embeddings[self.index]
        lo, hi = row_share(total, tp.size, tp.rank)
        self.embed = EngramTable(hi - lo, c.engram_head_dim, table_on_host, lo, total)
        self.shard_rules = {"embed.weight": VOCAB}  # rows [lo, hi): a contiguous share, uneven (row_share)
        self.wkv = Linear(self.columns * c.engram_head_dim, (c.hc_mult + 1) * c.dim)
        self.q_weight = param(c.hc_mult, c.dim)
        self.k_weight = param(c.hc_mult, c.dim)
        self.backend = kernels.current()

    def forward(self, x: torch.Tensor, rows: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
        """x [T, hc, D] streams; rows [T, columns] this layer's row ids; live [T] bool -> updated streams."""
        c = self.config
        T, n, D = x.shape
        emb = self.tp.all_reduce(self.embed(rows, x.dtype).reshape(T, -1))  # TP: each rank's rows, summed
        kv = wide(self.wkv(emb))
        key, value = kv[:, : n * D].view(T, n, D), kv[:, n * D:]
        return engram_mix(x, key, value, self.q_weight, self.k_weight, live, c.norm_eps, self.backend)
