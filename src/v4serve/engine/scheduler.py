"""Continuous batching: each step fills a token budget with decode rows and prefill chunks together.

Policy:
* decode rows first, in arrival order: a running request is never starved by prefills;
* then running prefills, then waiting requests (FIFO), each capped at `prefill_chunk` tokens per step so a cold
  100K-token prompt cannot stall warm short turns (a request alone in the engine takes `lone_chunk`, by default the
  whole budget); with window checkpoints, chunk ends land on block boundaries (checkpoints and prefix hits live
  there);
* in a step with decode rows, prefill tokens are capped by `PrefillBudget` (engine/itl_budget.py: a fixed cap or one
  derived from an inter-token-latency target), so running requests keep their pace while new prompts arrive, and
  `PrefillGate` may hold them back for a few decode-only steps so that turns arriving close together share one
  prefill step (bounded by a maximum delay);
* admission stops at `max_num_seqs` running requests or when blocks run short;
* when a running request needs a block and none is free, the most recently admitted other request is preempted
  (its blocks and slot are freed; its full blocks stay in the prefix cache, so its recompute is usually a hit).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from ..cache.manager import KVCacheManager, SlotOp
from .itl_budget import PrefillBudget, PrefillGate
from .request import FinishReason, Request, RequestStatus


@dataclass
class ScheduledRow:
    request: Request
    start: int  # first position computed
    num_tokens: int
    sample: bool  # the row ends at the last known token: sample the next one


@dataclass
class SchedulerOutput:
    rows: list[ScheduledRow]
    slot_ops: list[SlotOp]
    num_tokens: int
    preempted: list[Request] = field(default_factory=list)
    failed: list[Request] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.rows


class Scheduler:
    def __init__(self, kv: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int, prefill_chunk: int,
                 block_size: int, window: int, align_chunks: bool, decoder_trim: bool,
                 prefill_budget: PrefillBudget | None = None, prefill_gate: PrefillGate | None = None,
                 lone_chunk: int | None = None):
        self.kv = kv
        self.prefill_budget = prefill_budget or PrefillBudget()
        self.prefill_gate = prefill_gate or PrefillGate()
        self.max_num_seqs = max_num_seqs
        self.budget = max_num_batched_tokens
        self.prefill_chunk = prefill_chunk
        self.lone_chunk = lone_chunk or prefill_chunk  # a request alone in the engine: nothing to hold back
        self.block_size = block_size
        self.window = window
        self.align_chunks = align_chunks
        self.decoder_trim = decoder_trim
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0

    # --- queue ---------------------------------------------------------------------------------------
    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def abort(self, req: Request) -> None:
        self.finish(req, FinishReason.ABORT)

    def finish(self, req: Request, reason: FinishReason, stop_reason: str | int | None = None) -> None:
        if req.is_finished:
            return
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.kv.free(req)
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason
        req.stop_reason = stop_reason

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    # --- one step ------------------------------------------------------------------------------------
    def _chunk(self, req: Request, budget: int) -> int:
        """Tokens to compute for `req` this step. With window checkpoints, a chunk ends on a block boundary, and the
        last chunk of a prompt stops at the prompt's last boundary first, so the window state there (where the
        session's next turn will resume) can be snapshotted."""
        remaining = req.num_tokens - req.num_computed
        chunk = self.lone_chunk if self.num_unfinished == 1 else self.prefill_chunk
        n = min(remaining, budget, chunk if remaining > 1 else 1)
        if self.align_chunks and n > 1:
            end = req.num_computed + n
            boundary = (end - 1 if n == remaining else end) // self.block_size * self.block_size
            if boundary > req.num_computed:
                n = boundary - req.num_computed
        return n

    def schedule(self) -> SchedulerOutput:
        budget = self.budget
        rows: list[ScheduledRow] = []
        preempted: list[Request] = []
        failed: list[Request] = []
        # running requests: decodes first (stable: arrival order within each group)
        order = sorted(self.running, key=lambda r: (r.in_prefill, r.arrival_time))
        scheduled: set[str] = set()
        cap = self.prefill_budget.tokens()
        decodes = prefill_used = 0
        hold = self.prefill_gate.active and not self.prefill_gate.open(time.monotonic(), self._pending_since())

        def room() -> int:  # tokens the next prefill may take: the budget, capped in a step with decode rows
            if not decodes:
                return budget
            if hold:
                return 0
            return budget if cap is None else min(budget, cap - prefill_used)

        for req in order:
            if budget <= 0:
                break
            if req.status != RequestStatus.RUNNING:
                continue  # preempted earlier in this loop
            prefill = req.num_tokens - req.num_computed > 1  # decode rows come first in `order`
            limit = room() if prefill else budget
            if limit <= 0:
                continue
            n = self._chunk(req, limit)
            while not self.kv.ensure_blocks(req, req.num_computed + n):
                victim = self._victim(exclude=req)
                if victim is None:
                    break
                if victim.request_id in scheduled:
                    budget += sum(r.num_tokens for r in rows if r.request is victim)
                    rows = [r for r in rows if r.request is not victim]
                    scheduled.discard(victim.request_id)
                self._preempt(victim)
                preempted.append(victim)
            else:
                rows.append(self._row(req, n))
                scheduled.add(req.request_id)
                budget -= n
                if prefill:
                    prefill_used += n
                else:
                    decodes += 1
                continue
            # nothing left to preempt: the request alone exceeds the cache
            self.finish(req, FinishReason.ERROR)
            req.error = "the request needs more KV-cache blocks than the engine has; raise --kv-cache-memory " \
                        "(or --gpu-memory-utilization) or lower --max-model-len"
            failed.append(req)
        # admission (FIFO among the ready: a request whose grammar is still compiling lets the next ones pass)
        while self.waiting and room() > 0 and len(self.running) < self.max_num_seqs and self.kv.has_free_slot():
            req = next((r for r in self.waiting if r.ready), None)
            if req is None:
                break
            self.kv.admit(req)
            req.prefill_target = req.num_tokens
            n = self._chunk(req, room())
            if not self.kv.ensure_blocks(req, req.num_computed + n):
                self.kv.cancel_admission(req)
                if not self.running and not rows:
                    self._take(req)
                    self.finish(req, FinishReason.ERROR)
                    req.error = "the prompt needs more KV-cache blocks than the engine has; raise " \
                                "--kv-cache-memory (or --gpu-memory-utilization) or lower --max-model-len"
                    failed.append(req)
                    continue
                break
            self._take(req)
            req.status = RequestStatus.RUNNING
            if req.first_scheduled_time is None:
                req.first_scheduled_time = time.monotonic()
            self.running.append(req)
            rows.append(self._row(req, n))
            budget -= n
            prefill_used += n
        self.prefill_gate.note(decodes, prefill_used)
        return SchedulerOutput(rows, self.kv.take_ops(), self.budget - budget, preempted, failed)

    def _pending_since(self) -> float | None:
        """When the oldest prefill work still to do arrived (running prompts and ready waiting requests)."""
        times = [r.arrival_time for r in self.running if r.in_prefill]
        times += [r.arrival_time for r in self.waiting if r.ready]
        return min(times) if times else None

    def _take(self, req: Request) -> None:
        if self.waiting[0] is req:
            self.waiting.popleft()
        else:
            del self.waiting[next(i for i, r in enumerate(self.waiting) if r is req)]

    def _row(self, req: Request, n: int) -> ScheduledRow:
        return ScheduledRow(req, req.num_computed, n, req.num_computed + n == req.num_tokens)

    def _victim(self, exclude: Request) -> Request | None:
        cands = [r for r in self.running if r is not exclude]
        return max(cands, key=lambda r: r.arrival_time) if cands else None

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self.kv.free(req)
        req.status = RequestStatus.WAITING
        req.cache.num_computed = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    # --- after the step -----------------------------------------------------------------------------
    def advance(self, out: SchedulerOutput) -> None:
        """Account for the computed rows (before sampled tokens are appended)."""
        for row in out.rows:
            req = row.request
            if req.status != RequestStatus.RUNNING:
                continue
            req.cache.num_computed = row.start + row.num_tokens
            self.kv.after_step(req)

    def decoder_floor(self, req: Request) -> int:
        """V4.1 trimmed prefill: decoder layers need only the last `window` positions of what is known.

        A request asking for prompt logprobs is not trimmed (it wants logits at every position) unless it names its
        own trim reference (`trim_target`, used by the fidelity evaluation to teacher-force a continuation after a
        trimmed prompt)."""
        if not self.decoder_trim:
            return 0
        if req.trim_target is not None:
            return max(req.cache.window_floor, req.trim_target - self.window)
        if req.params.prompt_logprobs is not None:
            return 0
        return max(req.cache.window_floor, req.prefill_target - self.window)
