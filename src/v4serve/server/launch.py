"""`v4serve serve [MODEL]`: start the engine process, then the HTTP server, and keep the two tied.

* No MODEL: the built-in demo model, a `tiny-v4-flash` fp8 checkpoint written on first use to
  `${V4SERVE_HOME:-~/.cache/v4serve}/demo-tiny-v4-flash` (into a temporary folder, then renamed, so an
  interrupted first run never leaves a half-written model behind).
* The engine runs in its own process (engine/core.py) and ignores the terminal's Ctrl+C: the server drains
  and then stops it, so a shutdown never leaves a request half-aborted.
* SIGINT / SIGTERM: graceful shutdown (open requests get --graceful-shutdown-timeout seconds), engine
  stopped, exit 0. An engine that dies makes /health answer 503 and the server exit with code 1 instead of
  hanging with open connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import tempfile
from argparse import Namespace
from collections.abc import Iterator
from pathlib import Path

import uvicorn

from ..dist.launcher import LauncherEnv, from_environment
from ..engine.config import EngineConfigError
from ..engine.core import AsyncEngineClient, EngineDeadError
from ..presets import DEMO_PRESET, is_preset
from .args import API_KEY_ENV

log = logging.getLogger("v4serve.server")
HOME_ENV = "V4SERVE_HOME"


def v4serve_home() -> Path:
    return Path(os.environ.get(HOME_ENV) or Path.home() / ".cache" / "v4serve")


def demo_checkpoint(home: Path | None = None) -> Path:
    """The demo model's folder, written (atomically) if it is not there yet."""
    from ..models.checkpoint import write_checkpoint
    from ..presets import get_preset

    home = home or v4serve_home()
    folder = home / f"demo-{DEMO_PRESET}"
    if (folder / "config.json").is_file():
        return folder
    home.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".demo-{DEMO_PRESET}-", dir=home))
    try:
        log.info("writing the demo model (%s, fp8, random weights) to %s (first run only)", DEMO_PRESET, folder)
        write_checkpoint(get_preset(DEMO_PRESET), tmp, seed=0, dtype="fp8")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp made it private
        try:
            os.rename(tmp, folder)
        except OSError:
            if not (folder / "config.json").is_file():  # not a concurrent first run that won the race
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


class _Server(uvicorn.Server):
    """uvicorn, with signal handlers that only request shutdown (uvicorn's own re-raise the signal after
    shutting down, which would kill this process before the engine is stopped)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.handle_exit, sig, None)
        try:
            yield
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)


def serve(args: Namespace) -> int:
    """Run until a signal (exit 0) or the engine's death (exit 1)."""
    from ..cli import engine_kwargs
    from ..engine.config import EngineConfig
    from ..models.factory import resolve_config
    from .vllm_compat import apply_vllm_args

    apply_vllm_args(args)
    if not args.api_key and os.environ.get(API_KEY_ENV):
        args.api_key = [os.environ[API_KEY_ENV]]
    names = args.served_model_name or []
    if args.model is None and len(names) > 1 and (is_preset(names[-1]) or Path(names[-1]).is_dir()):
        # `--served-model-name a b MODEL`: argparse gave MODEL to the names (it takes as many as it can)
        args.model = names.pop()
        log.info("serving %s (read as MODEL, not as a served name; put MODEL first to avoid this)", args.model)
    model = args.model or str(demo_checkpoint())
    resolve_config(model)  # a wrong MODEL fails here, before an engine process starts
    if not args.served_model_name:
        args.served_model_name = [args.model or DEMO_PRESET]
    kwargs = engine_kwargs(args)
    cfg = EngineConfig.from_kwargs(**kwargs)  # bad engine flags too
    launcher = from_environment()
    world = cfg.tensor_parallel_size * cfg.data_parallel_size
    if launcher is not None and (launcher.world_size != world or cfg.nnodes > 1):
        raise EngineConfigError(f"torchrun started {launcher.world_size} processes, but --tensor-parallel-size x "
                                f"--data-parallel-size is {world}: make them equal (and leave --nnodes to torchrun)")
    _check_gpus(cfg, launcher)
    if launcher is not None:  # started by torchrun: this process is one rank
        if launcher.rank > 0:
            return _serve_rank(model, cfg, launcher)
        kwargs.update(external_launcher=True, master_addr=launcher.master_addr, master_port=launcher.master_port)
    if getattr(args, "node_rank", 0):  # another machine of a multi-node layout: its ranks only, no HTTP server
        return _serve_node(model, args, cfg)
    return asyncio.run(_serve(model, args, kwargs))


def _check_gpus(cfg, launcher: LauncherEnv | None) -> None:
    """More ranks on this machine than it has GPUs (or rank 0 not on cuda:0) fails here, before any process starts."""
    world = cfg.tensor_parallel_size * cfg.data_parallel_size
    if world == 1:
        return
    from ..dist.workers import check_devices
    from ..engine.llm_engine import resolve_device

    here = launcher.local_world_size if launcher is not None else world // cfg.nnodes
    try:
        check_devices(resolve_device(cfg.device), here)
    except ValueError as e:
        raise EngineConfigError(str(e)) from None


def _build_kwargs(cfg) -> tuple:
    """(device, the model-building arguments every rank must share)."""
    from ..engine.llm_engine import resolve_device, resolve_dtype

    device = resolve_device(cfg.device)
    return device, dict(seed=cfg.seed, numerics=cfg.numerics, dtype=resolve_dtype(cfg.dtype, device),
                        with_mtp=cfg.with_mtp, kernels=cfg.kernels)


def _serve_rank(model: str, cfg, launcher: LauncherEnv) -> int:
    """A torchrun process of rank > 0: the worker loop of that rank on cuda:LOCAL_RANK, until rank 0 stops it."""
    from ..dist.workers import run_rank

    device, build_kwargs = _build_kwargs(cfg)
    log.info("torchrun rank %d of %d (local %d): waiting for rank 0 at %s:%d", launcher.rank, launcher.world_size,
             launcher.local_rank, launcher.master_addr, launcher.master_port)
    run_rank(launcher.rank, launcher.world_size, launcher.master_addr, str(launcher.master_port), model, build_kwargs,
             str(device), launcher.local_world_size, cfg.enable_expert_parallel, cfg.data_parallel_size > 1,
             cfg.tensor_parallel_size)
    return 0


def _serve_node(model: str, args: Namespace, cfg) -> int:
    from ..dist.workers import TensorParallelPeers

    device, build_kwargs = _build_kwargs(cfg)
    return TensorParallelPeers.serve_node(args.node_rank, cfg.nnodes, cfg.tensor_parallel_size * cfg.data_parallel_size,
                                          model, build_kwargs, device, cfg.master_addr, cfg.master_port,
                                          cfg.enable_expert_parallel, cfg.data_parallel_size > 1,
                                          cfg.tensor_parallel_size)


async def _start_engine(client: AsyncEngineClient, timeout: float) -> bool:
    """Start the engine process with SIGINT ignored (it inherits that); a signal meanwhile cancels."""
    loop = asyncio.get_running_loop()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        start = asyncio.ensure_future(client.start(timeout))
        await asyncio.sleep(0)  # the task runs up to its first wait: the engine process is spawned by then
    finally:
        signal.signal(signal.SIGINT, previous)
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, start.cancel)
    try:
        await start
        return True
    except asyncio.CancelledError:
        log.info("interrupted while the engine was loading")
        return False
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


async def _serve(model: str, args: Namespace, kwargs: dict) -> int:
    from ..tokenizer import Tokenizer
    from .app import create_app

    client = AsyncEngineClient(model, kwargs, log_level=str(args.log_level).upper())
    try:
        log.info("starting the engine for %s", model)
        if not await _start_engine(client, args.engine_ready_timeout):
            return 0
    except EngineDeadError as err:
        log.error("the engine did not start: %s", err)
        await client.shutdown()
        return 1
    exit_code = 0
    server: _Server | None = None
    try:
        ready = client.ready
        assert ready is not None
        log.info("engine ready: %s (%s); %s", ready.model, ready.family, ready.capacity)
        tokenizer = Tokenizer.from_pretrained(ready.checkpoint_folder)
        app = create_app(client, tokenizer, ready, args)
        config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.uvicorn_log_level,
                                access_log=args.access_log, lifespan="off",
                                ssl_keyfile=getattr(args, "ssl_keyfile", None),
                                ssl_certfile=getattr(args, "ssl_certfile", None),
                                timeout_graceful_shutdown=args.graceful_shutdown_timeout)
        server = _Server(config)

        async def watchdog() -> None:
            nonlocal exit_code
            while not server.started and not server.should_exit:
                await asyncio.sleep(0.05)
            if server.started:
                log.info("serving %s at http://%s:%d/v1 (model name: %s)", ready.model, args.host, args.port,
                         ", ".join(args.served_model_name))
            while not server.should_exit:
                if not client.alive:
                    reason = (client.fatal or "engine process exited").splitlines()
                    log.error("the engine died (%s); shutting down", reason[0] if reason else "")
                    exit_code = 1
                    server.should_exit = True
                    return
                await asyncio.sleep(0.25)

        guard = asyncio.ensure_future(watchdog())
        tasks = [guard]
        if not getattr(args, "disable_log_stats", False):
            from .stats_log import log_stats

            metrics = app.state.v4.metrics
            tasks.append(asyncio.ensure_future(log_stats(client, lambda: metrics.generated_total,
                                                         args.log_stats_interval)))
        try:
            await server.serve()
        finally:
            for task in tasks:
                task.cancel()
    finally:
        await client.shutdown()
    if server is not None and not server.started and exit_code == 0:
        return 1  # could not bind (uvicorn logged why)
    return exit_code
