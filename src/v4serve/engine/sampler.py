"""Batched token sampling on the logits' device.

`sample(logits, batch)` runs one step for every row at once: no Python loop over rows, no host
synchronisation and no data-dependent Python control flow, so it can be captured in a CUDA graph.
Which stages run is decided from host-side flags fixed when the `SamplingBatch` is built. A stage
that a row does not use leaves that row's values bit-for-bit unchanged (x/1, x - 0*c, ...), so a
row's result never depends on what else shares its batch.

Pipeline, per row:  logits (float32)
  -> repetition penalty (prompt + output tokens), frequency and presence penalties (output tokens)
  -> banned tokens (EOS/stop ids before min_tokens) set to -inf
  -> divide by temperature (greedy rows use 1)
  -> structured output: tokens the row's grammar forbids set to -inf  => "processed logits"
  -> top-k, then top-p, then min-p truncation to -inf    => "sampling logits"
  -> greedy rows: argmax (lowest id on ties); others: argmax(sampling logits + Gumbel noise).

Logprobs are log_softmax of the processed logits: after penalties, banned tokens and temperature,
before truncation (so the top-k alternatives have finite values). This is vLLM's
"processed_logits" flavour minus truncation, not its default raw-model logprobs. Greedy rows report
the penalised model distribution at temperature 1. A step none of whose rows asks for logprobs skips
them (`SamplingBatch.chosen_logprobs`: no log-sum-exp over the vocabulary), and a batch whose rows all
divide by 1 skips the division (`unit_temperature`); neither changes a token.

Randomness is a counter-based hash of (row seed, step, token id) computed with int64 tensor ops,
so a seeded request draws the same noise at any batch position and on any device, without
per-row torch.Generator objects. Arithmetic stays within 62 bits: products wrap mod 2**64 (torch
int64 semantics on CPU and CUDA) and are masked back to 62 bits, whose low bits the wrap leaves
exact, and values are non-negative before every right shift, so shifts are logical.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from v4serve.engine.sampling_params import SamplingParams
from v4serve.transfer import to_device

from ..ops.profiling import profiled

MASK62 = (1 << 62) - 1
# SplitMix64's odd multipliers, reduced to 62 bits (odd, so multiplying is a bijection mod 2**62)
_MUL1 = 0xBF58476D1CE4E5B9 & MASK62
_MUL2 = 0x94D049BB133111EB & MASK62
_GOLDEN = 0x9E3779B97F4A7C15 & MASK62  # Weyl increment between counters
_UNIFORM_BITS = 23  # u = (2h + 1) / 2**24: exact in float32, never 0 or 1


# --- counter-based noise --------------------------------------------------------------------------
def mix62(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64-style finaliser on 62-bit non-negative int64 values (a bijection)."""
    x = x ^ (x >> 31)
    x = (x * _MUL1) & MASK62
    x = x ^ (x >> 29)
    x = (x * _MUL2) & MASK62
    return x ^ (x >> 32)


def row_keys(seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """One 62-bit key per (seed, step); seeds and steps are int64 [B]."""
    return mix62((mix62(seeds & MASK62) + (steps + 1) * _GOLDEN) & MASK62)


def uniform_noise(seeds: torch.Tensor, steps: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[B, V] float32 uniforms in (0, 1), a pure function of (seed, step, token id)."""
    token_ids = torch.arange(vocab_size, dtype=torch.int64, device=seeds.device)
    h = mix62((row_keys(seeds, steps)[:, None] + token_ids * _GOLDEN) & MASK62)
    top = h >> (62 - _UNIFORM_BITS)
    return (2 * top + 1).to(torch.float32) * 2.0 ** -(_UNIFORM_BITS + 1)


def gumbel_noise(seeds: torch.Tensor, steps: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """-log(-log U): argmax(logits + noise) is a sample of softmax(logits) (Gumbel-max trick)."""
    return -torch.log(-torch.log(uniform_noise(seeds, steps, vocab_size)))


# --- per-step batch description -------------------------------------------------------------------
@dataclass
class SamplingBatch:
    """Per-row sampling state for one step, as tensors on the logits' device.

    Off values: temperature 1 (greedy rows also store 1, see `greedy`), top_k = vocab size,
    top_p 1, min_p 0, penalties 0/0/1. `output_counts` ([B, V] int32, generated-token counts) is
    set iff some row uses presence/frequency penalties; `seen` ([B, V] bool, prompt or output
    tokens) iff some row uses a repetition penalty; `banned` ([B, V] bool) iff some row must not
    emit EOS/stop ids yet. `steps` counts tokens generated so far; it indexes the noise stream and
    is what min_tokens compares against. `bitmask` / `bitmask_rows` (set by the runner) restrict
    constrained rows to the tokens their grammar allows (bit j of word w = token 32 w + j).
    """

    temperature: torch.Tensor  # [B] float32
    greedy: torch.Tensor  # [B] bool
    top_k: torch.Tensor  # [B] int64
    top_p: torch.Tensor  # [B] float32
    min_p: torch.Tensor  # [B] float32
    presence_penalty: torch.Tensor  # [B] float32
    frequency_penalty: torch.Tensor  # [B] float32
    repetition_penalty: torch.Tensor  # [B] float32
    seeds: torch.Tensor  # [B] int64, 62-bit
    steps: torch.Tensor  # [B] int64
    output_counts: torch.Tensor | None = None
    seen: torch.Tensor | None = None
    banned: torch.Tensor | None = None
    bitmask: torch.Tensor | None = None  # [R, ceil(V / 32)] int32, the allowed tokens of the constrained rows
    bitmask_rows: torch.Tensor | None = None  # [R] int64: each bitmask row's batch row (None: row i is row i)
    num_logprobs: int = 0  # top alternatives to return: max over rows of SamplingParams.logprobs
    # the chosen tokens' logprobs (a log-sum-exp over the vocabulary): the runner clears it when no row asks for
    # logprobs, and `sample` then returns none
    chosen_logprobs: bool = True
    unit_temperature: bool = False  # every row divides by 1 (greedy rows, temperature 1): the division is skipped
    all_greedy: bool = False
    use_top_k: bool = False
    use_top_p: bool = False
    use_min_p: bool = False

    @property
    def size(self) -> int:
        return self.temperature.shape[0]

    @classmethod
    def build(
        cls,
        params: Sequence[SamplingParams],
        *,
        vocab_size: int,
        device: torch.device | str = "cpu",
        output_ids: Sequence[Sequence[int]] | None = None,
        prompt_ids: Sequence[Sequence[int]] | None = None,
        seeds: Sequence[int | None] | None = None,
        steps: Sequence[int] | None = None,
        eos_id: int | None = None,
        guided: Sequence[bool] | None = None,
    ) -> SamplingBatch:
        """Describe one step for rows with these params.

        output_ids: tokens generated so far per row (needed for penalties; gives default steps).
        prompt_ids: needed only for the repetition penalty. seeds: per-row override of
        params.seed (e.g. a seed the engine drew once at admission); rows with neither get a fresh
        random seed. steps: per-row step counters (default len(output_ids[i]), else 0).
        eos_id: banned, with stop_token_ids, while a row has fewer than min_tokens outputs.
        guided: rows whose grammar decides where the output ends: min_tokens bans nothing there
        (a grammar that allows only EOS would otherwise leave no token).
        """
        rows = len(params)
        outputs = list(output_ids) if output_ids is not None else [()] * rows
        prompts = list(prompt_ids) if prompt_ids is not None else [()] * rows
        counters = list(steps) if steps is not None else [len(o) for o in outputs]
        row_seeds = [
            s if s is not None else p.seed for s, p in zip(seeds or [None] * rows, params, strict=True)
        ]
        fresh = iter(fresh_seeds(sum(s is None for s in row_seeds)))
        row_seeds = [(s if s is not None else next(fresh)) & MASK62 for s in row_seeds]

        top_k = [min(p.effective_top_k, vocab_size) or vocab_size for p in params]
        # two host tensors, two copies that do not wait for the GPU (the per-row values as views of them)
        f = to_device(torch.tensor([[1.0 if p.greedy else p.temperature for p in params], [p.top_p for p in params],
                                    [p.min_p for p in params], [p.presence_penalty for p in params],
                                    [p.frequency_penalty for p in params], [p.repetition_penalty for p in params]],
                                   dtype=torch.float32).view(6, rows), device)
        i = to_device(torch.tensor([top_k, row_seeds, counters, [int(p.greedy) for p in params]],
                                   dtype=torch.int64).view(4, rows), device)
        batch = cls(
            temperature=f[0], greedy=i[3] != 0, top_k=i[0], top_p=f[1], min_p=f[2], presence_penalty=f[3],
            frequency_penalty=f[4], repetition_penalty=f[5], seeds=i[1], steps=i[2],
            num_logprobs=max((p.logprobs or 0 for p in params), default=0),
            unit_temperature=all(p.greedy or p.temperature == 1.0 for p in params),
            all_greedy=all(p.greedy for p in params),
            use_top_k=any(k < vocab_size for k in top_k),
            use_top_p=any(p.top_p < 1.0 for p in params),
            use_min_p=any(p.min_p > 0.0 for p in params),
        )
        # rows without a penalty contribute no tokens: their zero/one penalties are exact no-ops
        if any(p.presence_penalty != 0.0 or p.frequency_penalty != 0.0 for p in params):
            counted = [
                o if p.presence_penalty or p.frequency_penalty else () for p, o in zip(params, outputs)
            ]
            batch.output_counts = token_counts(counted, vocab_size, device)
        if any(p.repetition_penalty != 1.0 for p in params):
            seen = [
                [*pr, *o] if p.repetition_penalty != 1.0 else () for p, pr, o in zip(params, prompts, outputs)
            ]
            batch.seen = token_counts(seen, vocab_size, device) > 0
        free = list(guided) if guided is not None else [False] * rows
        bans = [sorted(p.stop_ids(eos_id)) if n < p.min_tokens and not g else []
                for p, n, g in zip(params, counters, free, strict=True)]
        if any(bans):
            batch.banned = token_counts(bans, vocab_size, device) > 0
        return batch


def fresh_seeds(n: int) -> list[int]:
    """n random 62-bit seeds from the OS (safe across forked workers, unlike a shared PRNG)."""
    raw = os.urandom(8 * n)
    return [int.from_bytes(raw[8 * i : 8 * i + 8], "little") & MASK62 for i in range(n)]


def token_counts(rows: Sequence[Sequence[int]], vocab_size: int, device: torch.device | str) -> torch.Tensor:
    """[B, V] int32 occurrence counts of each row's token ids."""
    width = max((len(r) for r in rows), default=0)
    # pad with an extra column V that is dropped afterwards
    padded = torch.tensor([[*r, *([vocab_size] * (width - len(r)))] for r in rows], dtype=torch.int64)
    padded = to_device(padded.reshape(len(rows), width), device)
    counts = torch.zeros(len(rows), vocab_size + 1, dtype=torch.int32, device=device)
    counts.scatter_add_(1, padded, torch.ones_like(padded, dtype=torch.int32))
    return counts[:, :vocab_size]


# --- the sampler ----------------------------------------------------------------------------------
@dataclass
class SamplerOutput:
    token_ids: torch.Tensor  # [B] int64
    logprobs: torch.Tensor | None  # [B] float32, of the chosen tokens (None: SamplingBatch.chosen_logprobs off)
    top_ids: torch.Tensor | None = None  # [B, num_logprobs] int64, most likely first
    top_logprobs: torch.Tensor | None = None  # [B, num_logprobs] float32


def process_logits(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Penalties, banned tokens and temperature: the distribution logprobs are reported for."""
    x = logits.to(torch.float32)
    if batch.seen is not None:
        rep = batch.repetition_penalty[:, None]
        x = torch.where(batch.seen, torch.where(x > 0, x / rep, x * rep), x)
    if batch.output_counts is not None:
        counts = batch.output_counts.to(torch.float32)
        x = x - batch.frequency_penalty[:, None] * counts
        x = x - batch.presence_penalty[:, None] * (counts > 0).to(torch.float32)
    if batch.banned is not None:
        x = x.masked_fill(batch.banned, float("-inf"))
    if not batch.unit_temperature:  # (x / 1 is x: skipping it changes no bit)
        x = x / batch.temperature[:, None]
    if batch.bitmask is not None:
        if x is logits:  # no stage above made a new tensor: the caller's logits must not change
            x = x.clone()
        apply_bitmask_(x, batch.bitmask, batch.bitmask_rows)  # x is a fresh tensor here: in place is safe
    return x


_BIAS_TABLES: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}
_CPU_CHUNK = 4  # bitmask rows per bias on the CPU: a [4, 129K] bias (2 MB) stays in cache


def bitmask_bias(bitmask: torch.Tensor, vocab_size: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[R, V]: 0 where the bitmask allows the token, -inf where it does not; adding it leaves the value of allowed
    logits unchanged. One lookup per bitmask byte in a [256, 8] table of 0 / -inf: on one CPU thread this is
    several times faster than `masked_fill` / `where` with a boolean mask (~50 ms for [64, 129K])."""
    table = _BIAS_TABLES.get((bitmask.device, dtype))
    if table is None:
        bits = (torch.arange(256)[:, None] >> torch.arange(8)) & 1
        table = torch.zeros(256, 8, dtype=dtype).masked_fill_(bits == 0, float("-inf")).to(bitmask.device)
        _BIAS_TABLES[(bitmask.device, dtype)] = table
    # little-endian int32 words: byte k of word w holds tokens 32 w + 8 k ... + 7, lowest bit first
    index = bitmask.contiguous().view(torch.uint8).reshape(-1).to(torch.int32)
    return table.index_select(0, index).view(bitmask.shape[0], -1)[:, :vocab_size]


def apply_bitmask_(x: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | None) -> None:
    """In place: -inf on x's tokens the bitmask forbids; bitmask row i is x's row rows[i] (or row i). On the CPU a
    few rows at a time, so no [R, V] bias is ever materialised (~9 ms instead of ~21 ms for [64, 129K])."""
    n = bitmask.shape[0]
    step = n if x.device.type != "cpu" else _CPU_CHUNK
    for start in range(0, n, step):
        bias = bitmask_bias(bitmask[start:start + step], x.shape[-1], x.dtype)
        if rows is None:
            x[start:start + step].add_(bias)
        else:
            x.index_add_(0, rows[start:start + step], bias)


def truncate_logits(x: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Set tokens removed by top-k, then top-p, then min-p to -inf. The most likely token always
    survives. Ties at a top-k boundary keep the lower ids (stable sort)."""
    if not (batch.use_top_k or batch.use_top_p):
        if batch.use_min_p:  # min-p alone needs no sort: it is a threshold relative to the max
            floor = x.amax(dim=-1, keepdim=True) + torch.log(batch.min_p)[:, None]
            x = x.masked_fill(x < floor, float("-inf"))
        return x
    sorted_x, order = torch.sort(x, dim=-1, descending=True, stable=True)
    rank = torch.arange(x.shape[-1], device=x.device)
    drop = rank[None, :] >= batch.top_k[:, None]
    if batch.use_top_p:
        probs = torch.softmax(sorted_x.masked_fill(drop, float("-inf")), dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs  # mass of strictly more likely tokens
        # keep the smallest prefix reaching top_p; rows with top_p = 1 skip it (cumsum rounding)
        drop |= (before >= batch.top_p[:, None]) & (batch.top_p < 1.0)[:, None]
    if batch.use_min_p:
        # p_i >= min_p * p_max  <=>  x_i >= x_max + log(min_p); renormalising keeps the ratio
        drop |= sorted_x < sorted_x[:, :1] + torch.log(batch.min_p)[:, None]
    return torch.empty_like(x).scatter_(1, order, sorted_x.masked_fill(drop, float("-inf")))


@functools.cache
def _chunk(vocab: int) -> int:
    """The smallest divisor of `vocab` from 512 (0: none up to 4096); once per vocabulary size, not per step."""
    return next((c for c in range(512, min(vocab, 4096) + 1) if vocab % c == 0), 0)


def first_argmax(scores: torch.Tensor) -> torch.Tensor:
    """torch.argmax(scores, -1) (the first maximal index: greedy ties go to the lowest id; a NaN counts as the largest)
    in two levels over chunks of the vocabulary: CUDA's argmax gives a whole row of 129,280 logits to one thread block
    (38 us a step on the H100, batch 1); the chunks' maxima (the first in each chunk) spread over many, and the first
    chunk holding the row's maximum holds its first maximal index."""
    c = _chunk(scores.shape[-1]) if scores.is_cuda else 0
    if c == 0 or scores.shape[-1] // c < 8:
        return torch.argmax(scores, dim=-1)
    return chunked_argmax(scores, c)


def chunked_argmax(scores: torch.Tensor, c: int) -> torch.Tensor:
    """`first_argmax` over chunks of c logits (c divides the vocabulary), on any device."""
    rows, vocab = scores.shape
    best, at = scores.reshape(rows, vocab // c, c).max(dim=-1)
    chunk = torch.argmax(best, dim=-1, keepdim=True)
    return (at.gather(1, chunk) + chunk * c).squeeze(1)


@profiled("sampling")
def sample(logits: torch.Tensor, batch: SamplingBatch) -> SamplerOutput:
    """Sample one token per row of `logits` [B, V] (any float dtype); see the module docstring."""
    processed = process_logits(logits, batch)
    scores = truncate_logits(processed, batch)
    if not batch.all_greedy:
        noise = gumbel_noise(batch.seeds, batch.steps, processed.shape[-1])
        scores = scores + noise.masked_fill_(batch.greedy[:, None], 0.0)
    token_ids = first_argmax(scores)
    if not (batch.chosen_logprobs or batch.num_logprobs > 0):
        return SamplerOutput(token_ids=token_ids, logprobs=None)
    log_norm = torch.logsumexp(processed, dim=-1)
    chosen = processed.gather(1, token_ids[:, None]).squeeze(1) - log_norm
    out = SamplerOutput(token_ids=token_ids, logprobs=chosen)
    if batch.num_logprobs > 0:
        values, ids = torch.topk(processed, batch.num_logprobs, dim=-1)
        out.top_ids, out.top_logprobs = ids, values - log_norm[:, None]
    return out
