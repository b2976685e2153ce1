"""ModelRunner: turns a scheduled step into the model's StepInput, runs it, and samples.

The runner owns the device state (model, KV pools); the scheduler never sees tensors. Uniform decode steps run
through captured CUDA graphs when available (engine/graphs.py), steps with prompt tokens through the chunk graphs
where turned on (engine/chunk_graphs.py); everything else runs eagerly.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch

from ..cache.manager import SlotOp
from ..cache.pool import KVPools
from ..models.step import RowSpec, StepInput, build_step
from ..transfer import to_device
from . import async_steps
from .async_steps import InFlight
from .request import Request
from .sampler import SamplingBatch, sample
from .scheduler import SchedulerOutput


def apply_slot_ops(pools: KVPools, ops: list[SlotOp], device: torch.device) -> None:
    """The scheduler's slot operations on one rank's pools (tensor-parallel workers replay them too)."""
    for op in ops:
        if op.kind == "reset":
            pools.reset_slots(to_device(torch.tensor([op.dst]), device))
        elif op.kind == "copy":
            pools.copy_slot(op.dst, op.src)
        else:
            raise ValueError(op.kind)


@dataclass
class SampledToken:
    request: Request
    token_id: int
    logprob: float | None  # None when no row of the step asked for logprobs
    top: dict[int, float] | None


@dataclass
class RunnerOutput:
    sampled: list[SampledToken]
    prompt_logprobs: dict[str, list[dict[int, float] | None]]  # request id -> entries for this chunk


class ModelRunner:
    def __init__(self, model: torch.nn.Module, pools: KVPools, vocab_size: int, eos_id: int,
                 device: torch.device, max_model_len: int, graphs: object | None = None):
        self.model = model
        self.pools = pools
        self.vocab_size = vocab_size
        self.eos_id = eos_id
        self.device = device
        self.max_model_len = max_model_len
        self.graphs = graphs  # decode graphs (engine/graphs.py)
        self.chunk_graphs = None  # graphs of steps with prompt tokens (engine/chunk_graphs.py; world size 1)
        self._dp_widths: list[dict[int, int]] | None = None  # DEP graphs (_graphed_dp)
        self.step_hook = None  # sets the model-specific inputs of each step (V4.1: the Engram n-gram history)
        self.logits_tap = None  # observer of each step's logits (the fidelity evaluation reads full distributions)
        self.peers = None  # dist.workers.TensorParallelPeers: the other tensor-parallel ranks replay each step
        self.masks: Any = None  # guided_batch.MaskBuilder, made with the first constrained row

    def apply_ops(self, ops: list[SlotOp]) -> None:
        apply_slot_ops(self.pools, ops, self.device)

    def specs(self, sched: SchedulerOutput, decoder_floor) -> list[RowSpec]:
        """The step's rows in plain Python (and which logits each row wants, for sampling)."""
        specs = []
        self._logits_from = []
        for row in sched.rows:
            req = row.request
            want_all = req.params.prompt_logprobs is not None and row.start < req.num_prompt_tokens
            floor = decoder_floor(req)
            self._logits_from.append(max(row.start, floor) if want_all else -1)
            specs.append(RowSpec(
                token_ids=req.tokens[row.start:row.start + row.num_tokens], start=row.start, slot=req.cache.slot,
                blocks=req.cache.blocks, window_floor=req.cache.window_floor, cached_len=req.cache.cached_len,
                decoder_floor=floor,
                logits="all" if want_all else ("last" if row.sample else "none"), logits_from=max(row.start, floor)))
        return specs

    def build(self, sched: SchedulerOutput, decoder_floor, specs: list[RowSpec] | None = None) -> StepInput:
        specs = specs if specs is not None else self.specs(sched, decoder_floor)
        # on the GPU every step sizes its compressed gathers by max_model_len, as the captured graphs do, so eager
        # and graphed steps run the same kernels on the same shapes (identical outputs)
        ctx = self.max_model_len if self.device.type == "cuda" else max(r.start + r.num_tokens for r in sched.rows)
        step = build_step(specs, self.device, max_context=ctx)
        if self.step_hook is not None:
            self.step_hook(sched, step)
        return step

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput, decoder_floor) -> RunnerOutput:
        self.apply_ops(sched.slot_ops)
        specs = self.specs(sched, decoder_floor)
        masks = self._submit_masks(sched)  # before the model step, which the fill then overlaps
        logits = self._graphed(sched, specs)
        if logits is None:
            step = self.build(sched, decoder_floor, specs)
            if self.peers is not None:
                self.peers.step(sched.slot_ops, step)
            logits = self.model(step, self.pools).logits
        if self.logits_tap is not None:
            self.logits_tap(sched, logits, self._logits_from)
        return self._sample(sched, logits, masks)

    def _graphed(self, sched: SchedulerOutput, specs: list[RowSpec], patch=None) -> torch.Tensor | None:
        """The step's logits from a captured graph: a decode graph, else a chunk graph; None when none takes it."""
        for graphs in (self.graphs, self.chunk_graphs):
            inp = graphs.prepare(sched, specs, self.step_hook) if graphs is not None else None
            if inp is not None:
                if self.peers is not None:  # tensor parallel: the workers replay their own graph of this bucket
                    self.peers.replay(sched.slot_ops, inp)
                return graphs.replay(inp, patch)
        return None

    @torch.inference_mode()
    def launch(self, sched: SchedulerOutput, decoder_floor, prev: InFlight | None) -> InFlight:
        """Async scheduling (engine/async_steps.py): run and sample a step without reading its tokens; rows whose
        token is pending read it from `prev` on the device. Only for steps `async_steps.eligible` allows: every row
        samples at most its last position and no row needs logprobs, penalties or a grammar mask."""
        self.apply_ops(sched.slot_ops)
        specs = self.specs(sched, decoder_floor)
        patch = async_steps.patcher(sched, prev)
        logits = self._graphed(sched, specs, patch)
        if logits is None:
            step = self.build(sched, decoder_floor, specs)
            if patch is not None:
                patch(step)
            logits = self.model(step, self.pools).logits
        reqs = [row.request for row in sched.rows if row.sample]
        if not reqs:
            return async_steps.InFlight(sched, [], logits.new_empty(0, dtype=torch.int64),
                                        torch.empty(0, dtype=torch.int64), None)
        # one logits row per sampling row, in order
        ids = sample(logits, self._sampling_batch(reqs, logits.device)).token_ids
        host, copied = async_steps.read_later(ids)
        return async_steps.InFlight(sched, reqs, ids, host, copied)

    @torch.inference_mode()
    def execute_dp(self, scheds: list[SchedulerOutput], decoder_floors: list) -> RunnerOutput:
        """DEP: one step of every data-parallel rank (scheds[r]: rank r's batch, possibly empty). Rank 0 builds every
        rank's StepInput and hands the workers theirs; each rank runs its own rows (a rank without rows only joins
        the MoE exchanges); the logits come back to rank 0, which samples all rows in rank order as one batch."""
        from ..dist.parallel import dep_step
        from ..models.v4.moe import dep_idle

        if self.graphs is not None:
            out = self._graphed_dp(scheds, decoder_floors)
            if out is not None:
                return out
        steps: list[StepInput | None] = []
        logits_from: list[int] = []
        for sched, floor in zip(scheds, decoder_floors):
            if sched.empty:
                steps.append(None)
                continue
            steps.append(self.build(sched, floor))
            logits_from += self._logits_from
        tokens = max(st.num_tokens for st in steps if st is not None)

        def run(dtype: torch.dtype, logit_rows: int) -> torch.Tensor | None:
            self.peers.step_dp([(sched.slot_ops, st) for sched, st in zip(scheds, steps)], tokens, logit_rows, dtype)
            with dep_step(tokens):
                if steps[0] is None:
                    dep_idle(self.model, tokens)
                    return None
                return self.model(steps[0], self.pools).logits

        return self._dp_step(scheds, logits_from, [0 if st is None else int(st.logits_index.numel()) for st in steps],
                             run)

    def _dp_step(self, scheds: list[SchedulerOutput], logits_from: list[int], rows: list[int],
                 run: Callable[[torch.dtype, int], torch.Tensor | None]) -> RunnerOutput:
        """What a DEP step does around its forwards, eager or graphed: the rows merged in rank order with their
        logits origins and masks, rank 0's slot operations, `run(dtype, logit_rows)` (the workers sent their step,
        rank 0's forward: its logits, or None), every rank's logits rows gathered (`rows[r]` of rank r's, padded to
        the largest), sampled as one batch."""
        merged = SchedulerOutput([row for sched in scheds for row in sched.rows], [],
                                 sum(sched.num_tokens for sched in scheds))
        self._logits_from = logits_from
        masks = self._submit_masks(merged)
        dtype = self.model.logits_dtype
        self.apply_ops(scheds[0].slot_ops)
        own = run(dtype, max(rows))
        if max(rows):
            parts = self.peers.gather_logits(own, max(rows), self.vocab_size, dtype)
            logits = torch.cat([part[:n] for part, n in zip(parts, rows)])
        else:
            logits = torch.empty(0, self.vocab_size, dtype=dtype, device=self.device)
        if self.logits_tap is not None:
            self.logits_tap(merged, logits, self._logits_from)
        return self._sample(merged, logits, masks)

    def _graphed_dp(self, scheds: list[SchedulerOutput], decoder_floors: list) -> RunnerOutput | None:
        """DEP, a uniform decode step on every rank that has rows: every rank replays its graph of one bucket (the
        largest rank's rows; an idle rank's inputs are padding only), whose captured MoE exchanges meet. None when
        some rank's step does not qualify (the step then runs eagerly)."""
        specs, logits_from = [], []
        for sched, floor in zip(scheds, decoder_floors):
            specs.append([] if sched.empty else self.specs(sched, floor))
            logits_from += [] if sched.empty else self._logits_from
        b = self.graphs.bucket(max(len(s) for s in specs))
        if b is None:
            return None
        if self._dp_widths is None:  # rank 0's copy of each worker's block-table width per bucket
            self._dp_widths = [dict.fromkeys(self.graphs.sizes, 0) for _ in scheds]
        inputs = []
        for r, (sched, rows) in enumerate(zip(scheds, specs)):
            inp = self.graphs.prepare(sched, rows, self.step_hook, bucket=b,
                                      width=None if r == 0 else self._dp_widths[r])
            if inp is None:
                return None
            inputs.append(inp)
        for r, inp in enumerate(inputs[1:], 1):
            self._dp_widths[r][b] = inp.widest

        def run(dtype: torch.dtype, logit_rows: int) -> torch.Tensor:
            self.peers.replay_dp([(sched.slot_ops, inp) for sched, inp in zip(scheds, inputs)], logit_rows, dtype)
            return self.graphs.replay(inputs[0])

        return self._dp_step(scheds, logits_from, [inp.rows for inp in inputs], run)

    def _submit_masks(self, sched: SchedulerOutput) -> Future[tuple[torch.Tensor, list[int]]] | None:
        """Start filling the token masks of this step's constrained rows (rows of the sampling batch)."""
        sampling = [row.request for row in sched.rows if row.sample]
        rows = [i for i, req in enumerate(sampling) if req.guide is not None and req.guide.active]
        if not rows:
            return None
        if self.masks is None:
            from .guided_batch import MaskBuilder  # xgrammar is loaded by now (it compiled these grammars)

            self.masks = MaskBuilder(self.vocab_size)
        return self.masks.submit([sampling[i].guide for i in rows], rows, len(sampling))

    def _sample(self, sched: SchedulerOutput, logits: torch.Tensor,
                masks: Future[tuple[torch.Tensor, list[int]]] | None = None) -> RunnerOutput:
        sample_rows: list[tuple[Request, int]] = []
        prompt_lp: dict[str, list[dict[int, float] | None]] = {}
        cursor = 0
        for row, first in zip(sched.rows, self._logits_from):
            req = row.request
            if first >= 0:  # prompt logprobs: logits of every position from `first` on
                n = row.start + row.num_tokens - first
                chunk = logits[cursor:cursor + n]
                prompt_lp[req.request_id] = [None] * (first - row.start) + self._prompt_logprobs(req, first, chunk)
                if row.sample:
                    sample_rows.append((req, cursor + n - 1))
                cursor += n
            elif row.sample:
                sample_rows.append((req, cursor))
                cursor += 1
        sampled: list[SampledToken] = []
        if sample_rows:
            idx = [i for _, i in sample_rows]
            reqs = [r for r, _ in sample_rows]
            batch = self._sampling_batch(reqs, logits.device)
            if masks is not None:
                bitmask, rows = masks.result()
                batch.bitmask = bitmask.to(logits.device, non_blocking=True)
                if rows != list(range(len(reqs))):  # not every row is constrained: which rows the bitmask has
                    batch.bitmask_rows = to_device(torch.tensor(rows, dtype=torch.int64), logits.device)
            # every row samples its only logits row (decode steps): no gather
            rows = logits if idx == list(range(logits.shape[0])) else logits[to_device(torch.tensor(idx), logits.device)]
            out = sample(rows, batch)
            ids = out.token_ids.tolist()
            lps = out.logprobs.tolist() if out.logprobs is not None else [None] * len(reqs)
            tops = out.top_ids.tolist() if out.top_ids is not None else None
            topv = out.top_logprobs.tolist() if out.top_logprobs is not None else None
            for i, r in enumerate(reqs):
                top = None
                if r.params.logprobs is not None:
                    k = r.params.logprobs
                    top = {ids[i]: lps[i]}
                    if tops is not None and k:
                        top.update({t: v for t, v in zip(tops[i][:k], topv[i][:k])})
                sampled.append(SampledToken(r, ids[i], lps[i], top))
        return RunnerOutput(sampled, prompt_lp)

    def _sampling_batch(self, reqs: list[Request], device: torch.device) -> SamplingBatch:
        """The sampling parameters of these rows on the device (prompt ids only for the repetition penalty; the
        log-sum-exp only when a row wants logprobs)."""
        batch = SamplingBatch.build(
            [r.params for r in reqs], vocab_size=self.vocab_size, device=device,
            output_ids=[r.output_token_ids for r in reqs],
            prompt_ids=[r.prompt_token_ids for r in reqs] if any(r.params.repetition_penalty != 1.0 for r in reqs)
            else None,
            seeds=[r.seed for r in reqs], eos_id=self.eos_id,
            guided=[r.guide is not None and r.guide.active for r in reqs])
        batch.chosen_logprobs = any(r.params.logprobs is not None for r in reqs)  # else no log-sum-exp
        return batch

    def _prompt_logprobs(self, req: Request, start: int, chunk: torch.Tensor) -> list[dict[int, float] | None]:
        """Entry i: logprob of prompt token start+i+1 (and the top-k) from the logits at position start+i."""
        lp = torch.log_softmax(chunk.float(), dim=-1)
        k = req.params.prompt_logprobs or 0
        toks = req.prompt_token_ids
        out: list[dict[int, float] | None] = []
        top_v, top_i = (lp.topk(k, dim=-1) if k else (None, None))
        for i in range(chunk.shape[0]):
            nxt = start + i + 1
            if nxt >= len(toks):
                break
            d = {toks[nxt]: float(lp[i, toks[nxt]])}
            if k:
                d.update({int(t): float(v) for t, v in zip(top_i[i].tolist(), top_v[i].tolist())})
            out.append(d)
        return out
