"""The engine loop in its own process, and the asyncio client the API server drives it with.

The engine process only steps the engine and moves typed messages (msgspec/msgpack over ZMQ IPC sockets): it
never waits on HTTP or tokenization. The client spawns it, routes each request's deltas to an asyncio queue,
and notices when the engine dies (every open stream then ends with an error and `alive` turns False).
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing as mp
import os
import tempfile
import time
import traceback
import uuid
from collections.abc import AsyncIterator
from typing import Any

import zmq
import zmq.asyncio

from . import compile_watch
from . import protocol as P

log = logging.getLogger("v4serve.core")
SLOW_STEP_S = 1.0  # an engine step this long is logged: it stalls every running request (the usual cause is a compile)


# ------------------------------------------------------------------------------------------------------------
# engine side
# ------------------------------------------------------------------------------------------------------------
def run_engine_core(model: str, engine_kwargs: dict[str, Any], in_addr: str, out_addr: str,
                    log_level: str = "INFO") -> None:
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s[engine]: %(message)s")
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.connect(in_addr)
    push = ctx.socket(zmq.PUSH)
    push.connect(out_addr)
    try:
        import torch

        from .config import EngineConfig
        from .llm_engine import LLMEngine

        cfg = EngineConfig.from_kwargs(**engine_kwargs)
        if cfg.tensor_parallel_size * cfg.data_parallel_size > 1:
            from ..dist import workers

            def rank_died(reason: str) -> None:  # (the rank watch's thread: a socket of its own)
                sock = ctx.socket(zmq.PUSH)
                sock.connect(out_addr)
                sock.send(P.encode(P.Fatal(f"engine stopped: {reason}")))
                sock.close(linger=2000)
                os._exit(1)

            workers.on_rank_death(rank_died)
        if cfg.device in ("cpu",) or (cfg.device == "auto" and not torch.cuda.is_available()):
            torch.set_num_threads(int(os.environ.get("V4SERVE_CPU_THREADS", "1")))
        engine = LLMEngine(model, cfg)
        watching = engine.device.type == "cuda" and compile_watch.install()
        if cfg.warmup or (cfg.warmup is None and engine.device.type == "cuda"):
            from .warmup import warm_up

            warm_up(engine)
            if watching:
                log.info("warm-up compiled %d kernel specialisations", len(compile_watch.take()))
    except Exception as e:  # a model that cannot load ends the server with the reason
        push.send(P.encode(P.Fatal(f"engine failed to start: {e}")))
        log.error("engine failed to start:\n%s", traceback.format_exc())
        os._exit(1)
    mc = engine.model_config
    push.send(P.encode(P.Ready(model=model, family=mc.family, max_model_len=engine.max_model_len,
                               vocab_size=mc.vocab_size, eos_token_id=mc.eos_token_id,
                               capacity=engine.describe_capacity(),
                               checkpoint_folder=str(engine.loaded.folder) if engine.loaded.folder else None)))
    poller = zmq.Poller()
    poller.register(pull, zmq.POLLIN)
    parent = os.getppid()
    try:
        while True:
            if os.getppid() != parent:  # the server died without telling us: do not outlive it
                log.error("the API server process is gone; the engine exits")
                return
            busy = engine.has_unfinished()
            events = dict(poller.poll(0 if busy else 50))
            while pull in events:
                msg = P.decode_to_engine(pull.recv())
                if isinstance(msg, P.Shutdown):
                    return
                _handle(engine, msg, push)
                events = dict(poller.poll(0))
            if engine.has_unfinished():
                t0 = time.perf_counter()
                deltas = engine.step()
                dt = time.perf_counter() - t0
                compiled = compile_watch.take() if watching else []
                if compiled:
                    log.warning("compiled while serving (a shape the warm-up missed): %s; the step took %.2f s for "
                                "%d rows, %d tokens", ", ".join(sorted({c.name for c in compiled})), dt,
                                engine.last_step_rows, engine.last_step_tokens)
                    for c in compiled:
                        if c.new:
                            log.warning("  %s new: %s", c.name, c.new)
                elif dt > SLOW_STEP_S:
                    log.warning("slow step: %.2f s for %d rows, %d tokens", dt, engine.last_step_rows,
                                engine.last_step_tokens)
                if deltas:
                    items = [P.Delta(**{k: getattr(d, k) for k in P.Delta.__struct_fields__}) for d in deltas]
                    push.send(P.encode(P.Deltas(items, dt, engine.last_step_tokens)))
                    for d in deltas:
                        if d.finished:
                            engine.release(d.request_id)
    except Exception:
        push.send(P.encode(P.Fatal("engine crashed:\n" + traceback.format_exc())))
        log.error("engine crashed:\n%s", traceback.format_exc())
        os._exit(1)
    finally:
        engine.close()  # tensor-parallel workers stop with the engine
        push.close(linger=100)
        pull.close(linger=0)


def _handle(engine, msg: P.ToEngine, push: zmq.Socket) -> None:
    from .llm_engine import RequestError
    from .sampling_params import SamplingParams

    if isinstance(msg, P.AddRequest):
        try:
            params = SamplingParams(**{k: getattr(msg.sampling, k) for k in msg.sampling.__struct_fields__})
            engine.add_request(msg.prompt_token_ids, params, msg.request_id, msg.cache_salt)
        except (RequestError, ValueError, TypeError) as e:
            push.send(P.encode(P.Rejected(msg.request_id, str(e))))
    elif isinstance(msg, P.Abort):
        for rid in msg.request_ids:
            engine.abort(rid)
    elif isinstance(msg, P.GetStats):
        stats = engine.stats()
        stats["max_model_len"] = engine.max_model_len
        push.send(P.encode(P.Stats(msg.token, stats)))


# ------------------------------------------------------------------------------------------------------------
# client side
# ------------------------------------------------------------------------------------------------------------
class EngineDeadError(RuntimeError):
    pass


class RequestRejected(ValueError):
    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


class AsyncEngineClient:
    def __init__(self, model: str, engine_kwargs: dict[str, Any], log_level: str = "INFO"):
        self.model = model
        self.engine_kwargs = engine_kwargs
        self.log_level = log_level
        tag = uuid.uuid4().hex[:12]
        d = tempfile.gettempdir()
        self.in_addr = f"ipc://{d}/v4serve-{tag}-in"
        self.out_addr = f"ipc://{d}/v4serve-{tag}-out"
        self.ready: P.Ready | None = None
        self.fatal: str | None = None
        self.proc: mp.process.BaseProcess | None = None
        self._queues: dict[str, asyncio.Queue] = {}
        self._stats: dict[int, asyncio.Future] = {}
        self._tokens = 0
        self._reader: asyncio.Task | None = None
        self.step_times: list[float] = []
        self.on_step = None  # called with each step's scheduled token count (vLLM's iteration_tokens_total)

    @property
    def alive(self) -> bool:
        return self.fatal is None and self.proc is not None and self.proc.is_alive()

    async def start(self, timeout: float = 1800.0) -> P.Ready:
        self.ctx = zmq.asyncio.Context()
        self.push = self.ctx.socket(zmq.PUSH)
        self.push.bind(self.in_addr)
        self.pull = self.ctx.socket(zmq.PULL)
        self.pull.bind(self.out_addr)
        spawn = mp.get_context("spawn")
        self.proc = spawn.Process(target=run_engine_core, name="v4serve-engine", daemon=True,
                                  args=(self.model, self.engine_kwargs, self.in_addr, self.out_addr, self.log_level))
        self.proc.start()
        deadline = time.monotonic() + timeout
        while True:
            if await self.pull.poll(200):
                msg = P.decode_from_engine(await self.pull.recv())
                if isinstance(msg, P.Ready):
                    self.ready = msg
                    break
                if isinstance(msg, P.Fatal):
                    self.fatal = msg.message
                    raise EngineDeadError(msg.message)
            if not self.proc.is_alive():
                self.fatal = f"engine process exited with code {self.proc.exitcode} before it was ready"
                raise EngineDeadError(self.fatal)
            if time.monotonic() > deadline:
                raise EngineDeadError(f"engine not ready after {timeout:.0f} s")
        self._reader = asyncio.create_task(self._read_loop())
        return self.ready

    async def _read_loop(self) -> None:
        try:
            while True:
                if not await self.pull.poll(500):
                    if self.proc is not None and not self.proc.is_alive():
                        self._die(f"engine process exited with code {self.proc.exitcode}")
                        return
                    continue
                msg = P.decode_from_engine(await self.pull.recv())
                if isinstance(msg, P.Deltas):
                    self.step_times.append(msg.step_time)
                    if self.on_step is not None:
                        self.on_step(msg.scheduled_tokens)
                    if len(self.step_times) > 4096:
                        del self.step_times[:2048]
                    for d in msg.items:
                        q = self._queues.get(d.request_id.split("#")[0])
                        if q is not None:
                            q.put_nowait(d)
                elif isinstance(msg, P.Rejected):
                    q = self._queues.get(msg.request_id)
                    if q is not None:
                        q.put_nowait(RequestRejected(msg.message, msg.status))
                elif isinstance(msg, P.Stats):
                    fut = self._stats.pop(msg.token, None)
                    if fut is not None and not fut.done():
                        fut.set_result(msg.payload)
                elif isinstance(msg, P.Fatal):
                    self._die(msg.message)
                    return
        except asyncio.CancelledError:
            pass

    def _die(self, message: str) -> None:
        self.fatal = message
        log.error("engine died: %s", message.splitlines()[0] if message else "")
        for q in self._queues.values():
            q.put_nowait(EngineDeadError(message))
        for fut in self._stats.values():
            if not fut.done():
                fut.set_exception(EngineDeadError(message))

    async def generate(self, request_id: str, prompt_token_ids: list[int], sampling: P.SamplingMsg,
                       cache_salt: str | None = None) -> AsyncIterator[P.Delta]:
        """Deltas of one request (n > 1: of all its siblings, `#i` in their ids) until all are finished."""
        if not self.alive:
            raise EngineDeadError(self.fatal or "engine is not running")
        q: asyncio.Queue = asyncio.Queue()
        self._queues[request_id] = q
        remaining = max(1, sampling.n)
        try:
            await self.push.send(P.encode(P.AddRequest(request_id, prompt_token_ids, sampling, cache_salt)))
            while remaining:
                item = await q.get()
                if isinstance(item, Exception):
                    raise item
                if item.finished:
                    remaining -= 1
                yield item
        except (asyncio.CancelledError, GeneratorExit):
            if remaining and self.alive:
                await self.abort([request_id])
            raise
        finally:
            self._queues.pop(request_id, None)

    async def abort(self, request_ids: list[str]) -> None:
        if self.alive:
            await self.push.send(P.encode(P.Abort(request_ids)))

    async def stats(self, timeout: float = 10.0) -> dict[str, Any]:
        if not self.alive:
            raise EngineDeadError(self.fatal or "engine is not running")
        self._tokens += 1
        token = self._tokens
        fut = asyncio.get_running_loop().create_future()
        self._stats[token] = fut
        await self.push.send(P.encode(P.GetStats(token)))
        try:
            return await asyncio.wait_for(fut, timeout)
        finally:
            self._stats.pop(token, None)

    async def shutdown(self) -> None:
        if self.proc is not None and self.proc.is_alive():
            try:
                await self.push.send(P.encode(P.Shutdown()))
            except zmq.ZMQError:
                pass
            self.proc.join(timeout=10)
            if self.proc.is_alive():
                self.proc.kill()
        if self._reader is not None:
            self._reader.cancel()
        for s in (getattr(self, "push", None), getattr(self, "pull", None)):
            if s is not None:
                s.close(linger=0)
        for addr in (self.in_addr, self.out_addr):
            path = addr.removeprefix("ipc://")
            if os.path.exists(path):
                os.unlink(path)
