"""Async scheduling (`--async-scheduling`): step N+1 is scheduled and launched before step N's sampled tokens reach
the host, so the host's per-step work (output handling, scheduling, step building, the launch) overlaps the GPU's
instead of following it.

How: when a step is launched, each sampling row's request gets a placeholder as its last output token
(`Request.pending_token`), so the scheduler sees one more token to compute, as it would after the token was read. The
next step feeds those rows' input tokens from the device (`patch`: the previous step's sampled ids, gathered into the
step's input in stream order). The previous step's tokens are then read (a non-blocking copy to pinned memory, waited
for only now) and replace the placeholders before the new step is accounted (`Scheduler.advance` hashes computed
tokens for the prefix cache: they are all real by then). A request that finished on step N had step N+1 computed in
vain: its output is dropped, and its KV writes go to blocks and a slot that are reused only by later steps, which the
stream orders after them. A preempted request with a placeholder waits until the token is read (`Request.ready`).

What steps synchronously instead (`eligible`): world size > 1, the logits tap, and any unfinished request that wants
logprobs, prompt logprobs, penalties (they read the output ids on the host) or structured output (its mask needs the
previous token). The in-flight step is drained first. V4.1's Engram history (the tokens before each input token) is
on the host by then: only the input token itself is pending.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from ..models.step import StepInput
from ..transfer import to_device
from .request import Request
from .scheduler import SchedulerOutput

PLACEHOLDER = 0  # the placeholder's value: never read as a token (the device patch overwrites it in the input)


@dataclass
class InFlight:
    """A launched step whose sampled tokens are on their way to the host."""

    sched: SchedulerOutput
    reqs: list[Request]  # the sampling rows' requests, in the order of `ids`
    ids: torch.Tensor  # [n] int64 on the device: what the next step feeds the rows whose token is pending
    host: torch.Tensor  # the same, copied to (pinned) host memory without blocking
    copied: torch.cuda.Event | None  # recorded after the copy (None on the CPU: the copy is done)
    launched_at: float = field(default_factory=time.monotonic)

    def tokens(self) -> list[int]:
        if self.copied is not None:
            self.copied.synchronize()
        return self.host.tolist()


def read_later(ids: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
    """A non-blocking copy of ids to page-locked host memory and the event that marks it done (CPU: a plain copy)."""
    if ids.device.type != "cuda":
        return ids.clone(), None
    host = torch.empty(ids.shape, dtype=ids.dtype, pin_memory=True)
    host.copy_(ids, non_blocking=True)
    done = torch.cuda.Event()
    done.record()
    return host, done


def eligible(requests: Iterable[Request]) -> bool:
    """Whether no unfinished request needs a host-side read of the previous step's tokens or logits."""
    for r in requests:
        if r.is_finished:
            continue
        p = r.params
        if (p.logprobs is not None or p.prompt_logprobs is not None or r.guide is not None
                or r.pending_grammar is not None or p.repetition_penalty != 1.0 or p.presence_penalty != 0.0
                or p.frequency_penalty != 0.0):
            return False
    return True


def patcher(sched: SchedulerOutput, prev: InFlight | None) -> Callable[[StepInput], None] | None:
    """The device patch of a step's input tokens: each row whose token is pending reads it from `prev.ids`."""
    if prev is None:
        return None
    where = {id(r): j for j, r in enumerate(prev.reqs)}
    dst, src, offset = [], [], 0
    for row in sched.rows:
        if row.request.pending_token:
            assert row.num_tokens == 1, "a pending token is fed by a one-token (decode) row"
            dst.append(offset)
            src.append(where[id(row.request)])
        offset += row.num_tokens
    if not dst:
        return None

    def patch(step: StepInput) -> None:
        d = to_device(torch.tensor(dst, dtype=torch.int64), step.device)
        s = to_device(torch.tensor(src, dtype=torch.int64), step.device)
        step.token_ids.index_copy_(0, d, prev.ids.index_select(0, s))

    return patch


def hold_places(reqs: list[Request]) -> None:
    """A placeholder for each launched sampling row's token (requests still running)."""
    for r in reqs:
        if not r.is_finished:
            r.output_token_ids.append(PLACEHOLDER)
            r.pending_token = True


def drop_place(req: Request) -> None:
    """Remove a request's placeholder (its token is read, or the request ended before it was)."""
    if req.pending_token:
        req.output_token_ids.pop()
        req.pending_token = False
