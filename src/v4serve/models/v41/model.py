"""The DeepSeek-V4.1 model (V4.1-Flash) with the engine-shaped forward `model(step, pools)`.

Causal encoder-decoder: layers 0 .. decoder_start-1 (0..20 for V4.1-Flash) run on every token of the step;
layers from decoder_start on own nothing but their window KV, so in prefill they may run on a suffix of each row
only: the tokens at positions >= `step.decoder_floor[row]` (SWA bounded replay; the engine sets the floor to
max(window_floor, prompt_len - window), or 0 for exact mode). Their window attention then cannot see window KV
below the floor. Decode rows (floor 0) are unaffected. Whether to trim is decided per step: `step.decoder_trim`
(a bool the engine may set to skip the check, e.g. for captured decode steps) or, when None, whether any row's
floor lies above its first position.

Engram needs each token's 3 predecessors, which may lie in earlier chunks: the engine passes them as
`step.engram_prev_ids` (see engine_hooks.py / engram_hash.prev_ids_for_rows), or precomputed row ids as
`step.engram_rows`; without either, every row must start at position 0 (the whole history is in the step).

Tensor parallelism (models/sharding.py): the embedding and head are vocab-parallel as in V4, attention and MoE reduce
over the ranks, Engram tables are split by rows. Every rank gets the same step, so the decoder trim keeps the same
tokens on every rank and all ranks run (or, with nothing left, skip) the same layers: their collectives line up.
The DSpark draft blocks are not built under TP (models/factory.py refuses with_mtp there).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ...cache.pool import KVPools
from ...config import ConfigError, ModelConfig
from ...dist import parallel
from ...ops import backend as kernels
from ...ops.linear import linear
from ...ops.mhc import hc_collapse
from ...ops.precision import wide
from ...ops.shard import VOCAB
from ..numerics import Numerics
from ..step import StepInput
from ..v4.context import StepContext
from ..v4.modules import Norm, param
from ..v4.moe import idle_layers
from ..vocab import embed_lookup, gather_logits
from .block import V41Block, identity_pre
from .dspark import DraftOutput, DSpark, DSparkBlock
from .engram import EngramTable
from .engram_hash import EngramHasher, validate_engram_rows
from .indexer import Selection

ENGRAM_HOST_ENV = "V4SERVE_ENGRAM_ON_HOST"  # "1": keep Engram tables in pinned host memory


@dataclass
class V41Output:
    logits: torch.Tensor  # [L, vocab] float32 for the step's logits_index
    hidden: torch.Tensor  # [T, hc, dim] final streams; tokens the decoder trim skipped hold their encoder output
    decoder_rows: torch.Tensor | None  # flat indices of the tokens the decoder layers computed (None: all)
    draft_taps: torch.Tensor | None  # [T', n_targets * dim] DSpark target-layer inputs of those tokens


class V41Model(nn.Module):
    def __init__(self, config: ModelConfig, numerics: Numerics, with_mtp: bool = True,
                 engram_on_host: bool | None = None, dtype: torch.dtype = torch.float32):
        super().__init__()
        c = config
        self.compute_dtype = dtype  # activations; the weights keep their stored formats
        self.backend = kernels.current()
        validate_engram_rows(c)
        _validate_selection_groups(c)
        self.config, self.numerics = c, numerics
        self.tp = parallel.current()
        vocab = c.vocab_size // self.tp.size  # this rank's rows of the embedding and head (models/vocab.py)
        self.embed = nn.Module()
        self.embed.weight = param(vocab, c.dim)
        self.layers = nn.ModuleList(V41Block(c, i, numerics) for i in range(c.n_layers))
        self.norm = Norm(c.dim, c.norm_eps)
        self.head = nn.Module()
        self.head.weight = param(vocab, c.dim)
        self.shard_rules = {"embed.weight": VOCAB, "head.weight": VOCAB}  # this rank's rows of the vocabulary
        self.mtp = nn.ModuleList(DSparkBlock(c, j, numerics) for j in range(c.n_mtp_layers if with_mtp else 0))
        self.engram_on_host = os.environ.get(ENGRAM_HOST_ENV) == "1" if engram_on_host is None else engram_on_host
        for m in self.modules():  # the loader keeps these tables on the host (models/loading.py `_placement`)
            if isinstance(m, EngramTable):
                m.on_host = self.engram_on_host
        self.hasher: EngramHasher | None = None
        self._tokenizer: str | Path | None = None

    @property
    def dtype(self) -> torch.dtype:
        return self.compute_dtype

    @property
    def logits_dtype(self) -> torch.dtype:
        return torch.float64 if self.compute_dtype == torch.float64 else torch.float32  # the head's accumulation

    # --- Engram -------------------------------------------------------------------------------------
    def bind_tokenizer(self, source) -> None:
        """Engram's compressed token ids come from the tokenizer: a tokenizer.json path / checkpoint folder, or a
        `tokenizers.Tokenizer`. Without a call, the tokenizer bundled with v4serve is used."""
        if not self.config.engram_layers:
            return
        if isinstance(source, (str, Path)):
            self._tokenizer = source
            self.hasher = None
        else:
            self.hasher = EngramHasher.from_backend(self.config, source)

    def engram_hasher(self) -> EngramHasher:
        if self.hasher is None:
            self.hasher = EngramHasher.from_tokenizer_file(self.config, self._tokenizer)
        return self.hasher

    def place_engram_tables(self, on_host: bool, pin: bool = True) -> None:
        """Keep the Engram tables in (pinned) host memory and gather each step's rows there, or on the device."""
        self.engram_on_host = on_host
        for m in self.modules():
            if isinstance(m, EngramTable):
                m.place(on_host, pin, self.embed.weight.device)

    def engram_inputs(self, step: StepInput) -> tuple[torch.Tensor, torch.Tensor]:
        """Row ids [T, n_engram_layers, 24] and gate liveness [T] of the step's tokens."""
        hasher = self.engram_hasher()
        live = hasher.live(step.token_ids)
        rows = step.engram_rows
        if rows is not None:
            return rows.to(step.device), live
        prev = step.engram_prev_ids
        if prev is None:
            prev = _prev_ids_within_step(step, self.config.engram_max_ngram - 1)
        return hasher.row_ids(step.token_ids, prev.to(step.device)), live

    # --- forward --------------------------------------------------------------------------------------
    def forward(self, step: StepInput, pools: KVPools) -> V41Output:
        c = self.config
        ctx = StepContext(step, c, pools, self.backend)
        rows = live = None
        if c.engram_layers:
            rows, live = self.engram_inputs(step)
        image = step.token_ids == c.image_token_id
        x = embed_lookup(self.embed.weight, step.token_ids, self.tp, self.compute_dtype)
        x = x.unsqueeze(1).expand(-1, c.hc_mult, -1).contiguous()
        pre = identity_pre(x)
        sel = Selection()
        kept = boundary = None
        taps: list[torch.Tensor] = []
        pending = None  # the block before's FFN expansion, run in this block's first mHC call where nothing between
        for i, layer in enumerate(self.layers):
            if pending is not None and (i == c.decoder_start or layer.engram is not None
                                        or i in c.dspark_target_layers):  # these read the finished streams
                x, pending = layer.expand(x, pending), None
            if i == c.decoder_start and (step.decoder_step is not None or self._trim(step)):
                boundary = x
                if step.decoder_step is not None:  # prepared on the host (the chunk graphs): no sync
                    sub, kept = step.decoder_step, step.decoder_kept
                else:
                    sub, kept = step.restrict_to_suffix(step.decoder_floor)
                    if bool((sub.logits_index < 0).any()):
                        raise ValueError("logits were requested for a token below its row's decoder_floor; the "
                                         "decoder layers skip those tokens (lower decoder_floor or ask for fewer "
                                         "logits)")
                ctx = StepContext(sub, c, pools, self.backend)
                x, pre, image, sel = x[kept], pre[kept], image[kept], sel.restrict(kept)
                taps = [t[kept] for t in taps]
                if rows is not None:
                    rows, live = rows[kept], live[kept]
                if sub.num_tokens == 0:
                    idle_layers(self.layers[i:], self.compute_dtype)  # DEP: the other ranks' MoE exchanges
                    break
            if layer.engram is not None:
                x = layer.engram(x, rows[:, layer.engram.index], live)
            if i in c.dspark_target_layers:
                taps.append(x.float().mean(1))
            x, pending, pre = layer.seam(x, pre, ctx, sel, image, pending)
        if pending is not None:
            x = self.layers[-1].expand(x, pending)
        li = ctx.step.logits_index
        logits = gather_logits(linear(wide(self.norm(hc_collapse(x[li], pre[li]))), self.head.weight, None, 0, 0,
                                      self.backend), self.tp)
        hidden = x
        if kept is not None:
            hidden = boundary.index_copy(0, kept, x) if x.shape[0] else boundary
        tap = torch.cat(taps, dim=-1) if taps and len(taps) == len(c.dspark_target_layers) else None
        if tap is not None and len(self.mtp) and tap.shape[0] and self._drafter().has_rings(pools):
            self._drafter().write_context(tap, ctx)
        return V41Output(logits, hidden, kept, tap)

    @staticmethod
    def _trim(step: StepInput) -> bool:
        if step.decoder_trim is not None:
            return step.decoder_trim
        if step.uniform_decode:  # decode rows never sit below their floor
            return False
        return bool((step.decoder_floor > step.row_start).any())

    # --- DSpark -------------------------------------------------------------------------------------
    def _drafter(self) -> DSpark:
        return DSpark(self.config, self.mtp, self.compute_dtype, self.backend)

    def draft(self, pools: KVPools, anchor_ids: torch.Tensor, anchor_pos: torch.Tensor, slots: torch.Tensor,
              window_floor: torch.Tensor | None = None, choose=None) -> DraftOutput:
        """Propose `dspark_block_size` tokens per row after position anchor_pos (see dspark.py)."""
        if not len(self.mtp):
            raise RuntimeError("this model was built without its DSpark blocks (with_mtp=False)")
        return self._drafter().draft(self.embed.weight, self.head.weight, pools, anchor_ids, anchor_pos, slots,
                                     window_floor, choose)


def _prev_ids_within_step(step: StepInput, lookback: int) -> torch.Tensor:
    """Predecessor ids when every row's history is inside the step (rows starting at position 0)."""
    pos, row = step.positions, step.token_row
    flat = torch.arange(step.num_tokens, device=step.device)
    cols = []
    for k in range(1, lookback + 1):
        inside = pos - k >= step.row_start[row]
        if bool((~inside & (pos - k >= 0)).any()):
            raise ValueError("Engram needs the 3 token ids before each row's first token: rows that start mid-"
                             "sequence need step.engram_prev_ids (models/v41/engine_hooks.py)")
        prev = step.token_ids[(flat - k).clamp(min=0)]
        cols.append(torch.where(inside, prev, torch.full_like(prev, -1)))
    return torch.stack(cols, dim=1)


def _validate_selection_groups(c: ModelConfig) -> None:
    cand = c.candidate_source_layer
    if cand < 0:
        return
    for s in c.index_source_layers:
        if s > cand and c.kv_source(s) != c.kv_source(cand):
            raise ConfigError(f"config field 'candidate_source_layer_id': index source {s} masks to layer {cand}'s "
                              f"candidate blocks but reads another KV source ({c.kv_source(s)})")
