"""Grammar compilation off the engine loop.

A request with `structured_outputs` is queued as usual, but the scheduler admits it only once its grammar is compiled
(`Request.ready`): a worker thread compiles it, and the requests queued behind it are admitted meanwhile. The first
compilation also imports xgrammar and builds the vocabulary (a few seconds on a CPU); later ones take milliseconds,
and a spec seen before (the LRU in engine/guided.py) costs nothing. Equal specs compiling at the same time share one
compilation (n > 1 siblings, a burst of requests with one schema). A spec that does not compile ends its request
with an error; the server checks specs before it sends them, so that is rare.

This module does not import xgrammar itself: the worker thread does, so the engine loop never waits for the import.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any

from .request import Request
from .sampling_params import StructuredOutputsParams

if TYPE_CHECKING:
    from ..tokenizer import Tokenizer
    from .guided import CompiledGuide, GrammarCompilerCache


def reasoning_open(prompt_ids: Sequence[int], think_start_id: int, think_end_id: int) -> bool:
    """Whether the prompt ends inside a reasoning block: its last think token is `<think>` (thinking mode's
    generation prompt). Chat mode, a forced tool call and a continued answer all end past `</think>`."""
    for tok in reversed(prompt_ids):
        if tok == think_end_id:
            return False
        if tok == think_start_id:
            return True
    return False


class GrammarAdmission:
    """Compiles the grammars of new requests in a worker thread and gives each request its guide when ready."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        self.tokenizer, self.vocab_size = tokenizer, vocab_size
        self.pending: list[Request] = []
        self._pool: ThreadPoolExecutor | None = None
        self._cache: GrammarCompilerCache | None = None
        self._lock = threading.Lock()
        self._in_flight: dict[StructuredOutputsParams, Future[CompiledGuide]] = {}

    def add(self, req: Request, spec: StructuredOutputsParams) -> None:
        """Queue `req`'s compilation; it is not `ready` until `resolve` has given it a guide."""
        req.pending_grammar = self._submit(spec)
        self.pending.append(req)

    def _submit(self, spec: StructuredOutputsParams) -> Future[CompiledGuide]:
        fut = self._in_flight.get(spec)
        if fut is not None:
            return fut
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="v4serve-grammar")
        fut = self._in_flight[spec] = self._pool.submit(self._compile, spec)
        fut.add_done_callback(lambda _: self._in_flight.pop(spec, None))
        return fut

    def _compile(self, spec: StructuredOutputsParams) -> CompiledGuide:
        with self._lock:
            if self._cache is None:
                from .guided import GrammarCompilerCache  # imports xgrammar: here, in the worker thread

                self._cache = GrammarCompilerCache(self.tokenizer, vocab_size=self.vocab_size)
        return self._cache.compile(spec)

    def resolve(self) -> list[tuple[Request, str]]:
        """Give every request whose compilation finished its guide; return (request, reason) for those whose
        compilation failed (still queued: the caller ends them). Finished (aborted) requests are dropped."""
        failed: list[tuple[Request, str]] = []
        still: list[Request] = []
        tok = self.tokenizer
        for req in self.pending:
            fut = req.pending_grammar
            if req.is_finished or fut is None:
                req.pending_grammar = None
                continue
            if not fut.done():
                still.append(req)
                continue
            req.pending_grammar = None
            err = fut.exception()
            if err is not None:
                field = getattr(err, "field", "structured_outputs")
                failed.append((req, f"{field}: {str(err).split(': ', 1)[-1]}"))
                continue
            wait_for_reasoning = reasoning_open(req.prompt_token_ids, tok.think_start_id, tok.think_end_id)
            req.guide = fut.result().matcher(wait_for_reasoning)
        self.pending = still
        return failed

    def wait(self, timeout: float) -> None:
        """Block until a pending compilation finishes or `timeout` seconds pass (an idle engine need not spin)."""
        futures: list[Future[Any]] = [r.pending_grammar for r in self.pending if r.pending_grammar is not None]
        if futures:
            wait(futures, timeout=timeout, return_when=FIRST_COMPLETED)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
