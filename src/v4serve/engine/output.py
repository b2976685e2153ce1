"""Per-request output handling: stop conditions, incremental text, stop strings."""

from __future__ import annotations

import time

from ..tokenizer import Tokenizer
from .detokenizer import IncrementalDetokenizer
from .request import FinishReason, Request, StepDelta
from .stop import StopStringStream


class OutputProcessor:
    """Turns one request's sampled tokens into text deltas and decides when it is done."""

    def __init__(self, req: Request, tokenizer: Tokenizer, eos_id: int, max_model_len: int):
        self.req = req
        self.eos_id = eos_id
        self.max_model_len = max_model_len
        p = req.params
        self.detok = IncrementalDetokenizer(tokenizer, p.skip_special_tokens)
        self.stops = StopStringStream(p.stop, p.include_stop_str_in_output)
        self.stop_ids = set(p.stop_token_ids)
        self.text = ""

    def append(self, token_id: int, top: dict[int, float] | None) -> tuple[str, FinishReason | None, str | int | None]:
        """Record one sampled token; returns (new text, finish reason or None, stop reason)."""
        req, p = self.req, self.req.params
        req.output_token_ids.append(token_id)
        if top is not None:
            req.logprobs.append(top)
        n_out = len(req.output_token_ids)
        reason: FinishReason | None = None
        stop_reason: str | int | None = None
        if req.guide is not None:  # the grammar ends the output when it is complete (it accepted EOS)
            if not req.guide.accept(token_id):
                reason = FinishReason.ERROR
                req.error = f"token {token_id} does not fit the request's structured-output grammar"
            elif req.guide.terminated:
                reason = FinishReason.STOP
        if reason is None and n_out >= p.min_tokens:
            if token_id == self.eos_id and not p.ignore_eos:
                reason = FinishReason.STOP
            elif token_id in self.stop_ids:
                reason, stop_reason = FinishReason.STOP, token_id
        delta = self.detok.step([token_id])
        if n_out >= p.min_tokens and reason is None:
            d = self.stops.feed(delta)
            delta = d.text
            if d.stop is not None:
                reason, stop_reason = FinishReason.STOP, d.stop
        if reason is None and ((p.max_tokens is not None and n_out >= p.max_tokens)
                               or req.num_tokens >= self.max_model_len):
            reason = FinishReason.LENGTH
        if reason is not None and not self.stops.stopped:
            delta += self.detok.finish() + self.stops.flush()
        self.text += delta
        return delta, reason, stop_reason

    def delta(self, new_ids: list[int], text: str, finished: bool, new_logprobs=None) -> StepDelta:
        r = self.req
        d = StepDelta(
            request_id=r.request_id, new_token_ids=new_ids, text=text, finished=finished,
            finish_reason=r.finish_reason.value if finished and r.finish_reason else None,
            stop_reason=r.stop_reason, new_logprobs=new_logprobs, num_prompt_tokens=r.num_prompt_tokens,
            num_output_tokens=len(r.output_token_ids), num_cached_tokens=r.num_cached_tokens, error=r.error)
        if finished and r.first_scheduled_time is not None:
            end = r.finished_time or time.monotonic()
            d.queue_s = r.first_scheduled_time - r.arrival_time
            d.inference_s = end - r.first_scheduled_time
            if r.first_token_time is not None:
                d.prefill_s = r.first_token_time - r.first_scheduled_time
        return d
