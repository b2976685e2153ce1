"""How a module's tensors split over tensor-parallel ranks: each layer declares its own (its `shard_rules`), and the
loader and the deployment sizing read them from the model (models/sharding.py `rules_of`).

Kinds: COLUMN splits dim 0 (query heads: wq_b, wo_a's output groups, the sinks), ROW dim 1 (wo_b, whose output is
all-reduced), VOCAB dim 0 into contiguous row shares (the embedding, the head, V4.1's Engram tables), EXPERT a routed
expert (whole to its expert-parallel owner, or sliced as the shared expert is), SHARED_IN / SHARED_OUT an expert's
w1 / w3 (rows) and w2 (columns), REPLICATED the rest. Why each tensor splits as it does: models/sharding.py.
"""

from __future__ import annotations

from torch import nn

COLUMN, ROW, VOCAB, EXPERT, SHARED_IN, SHARED_OUT, REPLICATED = (
    "column", "row", "vocab", "expert", "expert-in", "expert-out", "replicated")
KINDS = (COLUMN, ROW, VOCAB, EXPERT, SHARED_IN, SHARED_OUT, REPLICATED)


def declared(module: nn.Module) -> dict[str, str]:
    """The module's own rules: tensor name relative to the module -> kind (a name ending in "." covers every tensor
    below it, e.g. the MoE's "experts."). `Linear`s declare theirs through `shard`; other modules set `shard_rules`."""
    rules = getattr(module, "shard_rules", None) or {}
    for kind in rules.values():
        if kind not in KINDS:
            raise ValueError(f"{type(module).__name__} declares an unknown split {kind!r}")
    return rules
