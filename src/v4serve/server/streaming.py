"""Moving one request between HTTP and the engine: admission, deltas, timing, disconnects, SSE.

* `Admission` refuses work beyond `--max-num-seqs + --max-queue-len` engine requests in flight (429 with
  Retry-After) and anything while the engine is dead (503).
* `EngineCall` is one admitted engine request (n siblings): it yields the engine's deltas, observes TTFT,
  inter-token and end-to-end latency, and when it ends early (the client went away, the handler failed)
  it aborts the request in the engine, which frees its KV blocks.
* `EventStream` sends server-sent events and always listens for the client hanging up: the generator is
  cancelled at once, so a disconnect aborts the request even between tokens.
* `until_disconnected` gives non-streaming requests the same behaviour.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from ..engine.core import AsyncEngineClient, EngineDeadError, RequestRejected
from ..engine.protocol import Delta, SamplingMsg
from .errors import APIError
from .metrics import ServerMetrics

log = logging.getLogger("v4serve.server")


class Admission:
    """Counts engine requests in flight and refuses those beyond the limit."""

    def __init__(self, limit: int, retry_after: int, metrics: ServerMetrics) -> None:
        self.limit = limit
        self.retry_after = retry_after
        self.in_flight = 0
        self.metrics = metrics

    def reserve(self, total: int, client: AsyncEngineClient, param: str = "n") -> None:
        """Check that `total` engine requests (a batch of prompts x n) can be admitted together, before any starts:
        a batch that can never fit is the client's 400; one that does not fit now is a 429. The caller then
        acquires them one by one without awaiting in between, so none of them can be refused half-way."""
        if total > self.limit:
            raise APIError(f"{param}: this request asks for {total} completions (prompts x n), more than this server "
                           f"runs or queues at once ({self.limit}, --max-num-seqs + --max-queue-len); split it",
                           param=param, code="invalid_value")
        self._check(total, client)

    def acquire(self, n: int, client: AsyncEngineClient) -> None:
        self._check(n, client)
        self.in_flight += n
        self.metrics.in_flight.set(self.in_flight)

    def _check(self, n: int, client: AsyncEngineClient) -> None:
        """503 for a dead engine, 400 for `n` beyond the limit, 429 when it does not fit now."""
        if not client.alive:
            raise APIError(f"the engine is not running: {(client.fatal or 'stopped').splitlines()[0]}", 503,
                           code="engine_dead")
        if n > self.limit:
            raise APIError(f"n: {n} completions exceed what this server runs or queues at once ({self.limit}, "
                           "--max-num-seqs + --max-queue-len)", param="n", code="invalid_value")
        if self.in_flight + n > self.limit:
            raise APIError(f"the server is at capacity ({self.in_flight} requests running or queued, limit "
                           f"{self.limit} = --max-num-seqs + --max-queue-len); retry after {self.retry_after} s",
                           429, code="queue_full", headers={"Retry-After": str(self.retry_after)})

    def release(self, n: int) -> None:
        self.in_flight -= n
        self.metrics.in_flight.set(self.in_flight)


class EngineCall:
    """One engine request with `sampling.n` siblings; admitted on construction (raises 429/503)."""

    def __init__(self, client: AsyncEngineClient, admission: Admission, metrics: ServerMetrics, route: str,
                 request_id: str, prompt_ids: list[int], sampling: SamplingMsg, cache_salt: str | None,
                 arrival: float) -> None:
        self.client, self.admission, self.metrics, self.route = client, admission, metrics, route
        self.request_id, self.prompt_ids, self.sampling = request_id, prompt_ids, sampling
        self.cache_salt = cache_salt
        self.arrival = arrival
        self.n = max(1, sampling.n)
        admission.acquire(self.n, client)
        self._open = True
        self._first: dict[str, float] = {}
        self._last: dict[str, float] = {}
        self._finished: set[str] = set()

    async def deltas(self) -> AsyncIterator[Delta]:
        """The engine's deltas until every sibling finished. Engine errors become APIError."""
        try:
            gen = self.client.generate(self.request_id, self.prompt_ids, self.sampling, self.cache_salt)
            async with contextlib.aclosing(gen):
                async for d in gen:
                    self._observe(d)
                    yield d
        except RequestRejected as err:
            raise APIError(str(err), err.status) from None
        except EngineDeadError as err:
            raise APIError(f"the engine died: {str(err).splitlines()[0] if str(err) else 'no reason given'}",
                           503, code="engine_dead") from None
        finally:
            self.close()

    def _observe(self, d: Delta) -> None:
        now = time.monotonic()
        if d.new_token_ids:
            if d.request_id not in self._first:
                self._first[d.request_id] = now
                self.metrics.ttft.observe(now - self.arrival)
                self.metrics.vllm.ttft.observe(now - self.arrival)
            else:
                gap = (now - self._last[d.request_id]) / len(d.new_token_ids)
                for _ in d.new_token_ids:
                    self.metrics.itl.observe(gap)
                    self.metrics.vllm.itl.observe(gap)
            self._last[d.request_id] = now
        if d.finished and d.request_id not in self._finished:
            self._finished.add(d.request_id)
            self.metrics.e2e.observe(now - self.arrival)
            self.metrics.vllm.e2e.observe(now - self.arrival)
            self.metrics.vllm.finished(d.finish_reason or ("error" if d.error else "stop"), d.num_prompt_tokens,
                                       d.num_output_tokens, self._first.get(d.request_id),
                                       self._last.get(d.request_id))
            self.metrics.vllm.phases(d.queue_s, d.prefill_s, d.inference_s)
            self.metrics.observe_finished(self.route, d.finish_reason or ("error" if d.error else "stop"),
                                          d.num_prompt_tokens, d.num_output_tokens, d.num_cached_tokens)

    def close(self) -> None:
        """Release the admission slot; abort in the engine whatever has not finished (idempotent)."""
        if not self._open:
            return
        self._open = False
        self.admission.release(self.n)
        unfinished = self.n - len(self._finished)
        if unfinished > 0:
            label = "abort" if self.client.alive else "error"
            self.metrics.requests.labels(self.route, label).inc(unfinished)
            if self.client.alive:  # a task of its own: the caller may be in a cancelled scope
                _spawn(self.client.abort([self.request_id]))


_background: set[asyncio.Task] = set()


def _spawn(coro: Awaitable[Any]) -> None:
    task = asyncio.ensure_future(coro)
    _background.add(task)
    task.add_done_callback(_background.discard)


async def merge(streams: list[AsyncIterator[Any]]) -> AsyncIterator[tuple[int, Any]]:
    """Items of several async iterators as they come, tagged with the iterator's index; an error in one
    ends all (the others are cancelled, which aborts their engine requests)."""
    if len(streams) == 1:
        async for item in streams[0]:
            yield 0, item
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(i: int, it: AsyncIterator[Any]) -> None:
        try:
            async for item in it:
                await queue.put((i, item))
            await queue.put((i, done))
        except BaseException as err:  # noqa: BLE001 - handed to the consumer
            await queue.put((i, err))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            i, item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def until_disconnected(request: Request, work: Awaitable[Any]) -> Any:
    """Await `work` (a non-streaming request); if the client hangs up first, cancel it (its engine request
    is aborted) and return an empty 499 response nobody will read."""
    task = asyncio.ensure_future(work)
    gone = False

    async def watch() -> None:
        nonlocal gone
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                gone = True
                task.cancel()
                return

    watcher = asyncio.ensure_future(watch())
    try:
        return await task
    except asyncio.CancelledError:
        if gone:
            log.info("client disconnected from %s; request aborted", request.url.path)
            return Response(status_code=499)
        raise
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()


def sse(data: Any, event: str | None = None) -> bytes:
    body = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return (f"event: {event}\n" if event else "").encode() + b"data: " + body.encode() + b"\n\n"


class EventStream(StreamingResponse):
    """A server-sent-event response that stops (and closes its generator) as soon as the client leaves."""

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[bytes], on_close: Callable[[], None] | None = None) -> None:
        super().__init__(content, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as tg:
                async def run() -> None:
                    with contextlib.suppress(OSError):
                        await self.stream_response(send)
                    tg.cancel_scope.cancel()

                tg.start_soon(run)
                await self.listen_for_disconnect(receive)
                tg.cancel_scope.cancel()
        finally:
            closer = getattr(self.body_iterator, "aclose", None)
            if closer is not None:
                with anyio.CancelScope(shield=True):
                    await closer()
            if self.on_close is not None:
                self.on_close()
