"""How the parallel layouts split each checkpoint tensor: the rules the model's layers declare (ops/shard.py), read
from the model for sharded loading and from a skeleton of it (no weights) for deployment sizing.

Layouts use vLLM's names: tensor parallel (TP) splits attention heads and the vocabulary; `--enable-expert-parallel`
spreads the routed experts whole over all TP x DP ranks (EP); data parallel (DP) replicates the attention per rank, each
with its own requests and KV cache (DEP = DP attention + EP experts). Without EP, each routed expert is sliced across
the TP ranks (its intermediate dim), as the shared expert always is.

Splits by tensor:
* column (dim 0) by query head: attn.wq_b, attn.wo_a (by output group); attn_sink (one logit per head);
* row (dim 1): attn.wo_b (its output is all-reduced);
* vocab (dim 0): embed, head, and V4.1's Engram tables (a lookup like the embedding). The Engram tables hold ~101 GB
  (FP8 + scales) each in V4.1-Flash, so a replicated copy per rank would cost more than all the rest of a rank's
  share; split, each rank gathers the rows it owns (zeros elsewhere) and one all-reduce of the [tokens, 24 x 256]
  gathered rows per Engram layer sums them (exact: one nonzero term per row). Their row counts are not multiples of
  the world size: rank r holds rows [r * ceil(N / tp), ...), the last rank fewer (`row_share`);
* expert: routed experts whole to their EP rank, or (no EP) w1/w3 by rows and w2 by columns across TP, like the
  shared expert;
* replicated: wq_a, wkv and the single KV head, norms, compressors, mHC, the router gate and its bias, and the lightning
  indexer. V4.1 adds to the replicated set: its KV sources' CSA2 compressors and index keys (`indexer.wk`, `k_norm`),
  the indexer with its candidate level, the router's `bias_vl`, and Engram's `wkv` / `q_weight` / `k_weight` (small
  next to the tables). The indexer's scores sum over its heads before the top-k: splitting it by head would need an
  all-reduce of a [tokens, entries] score matrix per CSA layer and step (64K context: 16K floats per token), larger
  than its weights (an 8 MB wq_b and a 0.5 MB weights_proj per layer), so every rank scores the entries itself.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn

from ..config import ModelConfig
from ..ops.shard import COLUMN, EXPERT, REPLICATED, ROW, SHARED_IN, SHARED_OUT, VOCAB, declared
from .layout import TensorSpec

__all__ = ["COLUMN", "EXPERT", "REPLICATED", "ROW", "SHARED_IN", "SHARED_OUT", "VOCAB", "Layout", "Rules",
           "check_layout", "model_rules", "rank_config", "rank_fraction", "row_share", "rules_of"]


@dataclass(frozen=True)
class Layout:
    tensor_parallel: int = 1
    data_parallel: int = 1
    expert_parallel: bool = False

    def __post_init__(self) -> None:
        if self.tensor_parallel < 1 or self.data_parallel < 1:
            raise ValueError("parallel sizes must be at least 1")

    @property
    def gpus(self) -> int:
        return self.tensor_parallel * self.data_parallel

    @property
    def expert_ranks(self) -> int:
        """Ranks the routed experts are spread over (all GPUs with EP; none without)."""
        return self.gpus if self.expert_parallel else 1

    def describe(self) -> str:
        parts = [f"TP={self.tensor_parallel}"] + ([f"DP={self.data_parallel}"] if self.data_parallel > 1 else [])
        return " ".join(parts + ([f"EP={self.expert_ranks}"] if self.expert_parallel else []))


class Rules:
    """Every split a model's layers declare, by internal tensor name (scales follow their weight)."""

    def __init__(self, exact: dict[str, str], prefixes: dict[str, str]) -> None:
        self.exact, self.prefixes = exact, prefixes

    def kind(self, name: str) -> str:
        if name in self.exact:
            return self.exact[name]
        return next((k for p, k in self.prefixes.items() if name.startswith(p)), REPLICATED)


def rules_of(model: nn.Module) -> Rules:
    """The rules of every layer of `model` (each module's `shard_rules`, ops/shard.py), under its own name."""
    exact, prefixes = {}, {}
    for path, m in model.named_modules():
        for rel, kind in declared(m).items():
            full = f"{path}.{rel}" if path else rel
            (prefixes if rel.endswith(".") else exact)[full] = kind
    return Rules(exact, prefixes)


@functools.lru_cache(maxsize=16)
def model_rules(c: ModelConfig, with_mtp: bool = True) -> Rules:
    """The rules of a model of config `c`, read off a skeleton built on the meta device (no memory, no weights):
    deployment sizing before owning the GPUs (info.py)."""
    from .factory import model_class
    from .numerics import numerics_for

    with torch.device("meta"):
        net = model_class(c)(c, numerics_for(c, "deepseek"), with_mtp=with_mtp, dtype=torch.bfloat16)
    return rules_of(net)


def row_share(n: int, tp: int, rank: int) -> tuple[int, int]:
    """Rows [lo, hi) of an n-row table that `rank` of `tp` holds: ceil(n / tp) each, the last rank the rest (the
    even splits of embed / head give every rank n / tp)."""
    per = -(-n // tp)
    lo = min(n, rank * per)
    return lo, min(n, lo + per)


def rank_fraction(spec: TensorSpec, c: ModelConfig, layout: Layout, rules: Rules) -> float:
    """The share of `spec`'s bytes one GPU holds (the largest share where a split is uneven)."""
    kind = rules.kind(spec.name)
    tp = layout.tensor_parallel
    if kind == EXPERT:
        if layout.expert_parallel:
            per = -(-c.n_routed_experts // layout.expert_ranks)  # experts on the fullest rank
            return per / c.n_routed_experts
        return 1.0 / tp  # sliced like the shared expert
    if kind in (COLUMN, ROW, VOCAB, SHARED_IN, SHARED_OUT):
        dim = spec.shape[1] if kind in (ROW, SHARED_OUT) and len(spec.shape) > 1 else spec.shape[0]
        return (-(-dim // tp)) / dim
    return 1.0


def check_layout(c: ModelConfig, layout: Layout) -> None:
    """The splits must be even: heads, output groups, the shared expert's width and (EP) the experts."""
    tp = layout.tensor_parallel
    bad = []
    if c.n_heads % tp:
        bad.append(f"{c.n_heads} attention heads")
    if c.o_groups % tp:
        bad.append(f"{c.o_groups} output groups of wo_a")
    if c.moe_inter_dim % tp:
        bad.append(f"the expert width {c.moe_inter_dim}")
    if layout.expert_parallel and c.n_routed_experts % layout.expert_ranks:
        bad.append(f"{c.n_routed_experts} routed experts over {layout.expert_ranks} ranks")
    if bad:
        raise ValueError(f"{layout.describe()} does not split {c.name or 'this model'} evenly: " + ", ".join(bad))


def rank_config(c: ModelConfig, tp: int, expert_parallel: bool = False) -> ModelConfig:
    """The shapes one tensor-parallel rank builds: its heads, wo_a groups and (without EP) slice of every expert's
    width. With EP the routed experts keep their width (the MoE holds its own experts whole and slices only the shared
    expert); the vocabulary split is the embedding's and head's own business."""
    if tp == 1:
        return c
    check_layout(c, Layout(tp, 1, expert_parallel))
    if c.vocab_size % tp:
        raise ValueError(f"TP={tp} does not split the vocabulary of {c.vocab_size} tokens evenly")
    inter = c.moe_inter_dim if expert_parallel else c.moe_inter_dim // tp
    return c.replace(n_heads=c.n_heads // tp, o_groups=c.o_groups // tp, moe_inter_dim=inter)
