"""Tensor-parallel worker processes driven by rank 0's engine.

Rank 0 is the engine process: it schedules, builds each step and samples. Ranks 1..N-1 are spawned here; each builds its
share of the model (models/factory.build_model(tp=...)) and a KV pool set of the same geometry, then replays what rank 0
sends: the step's slot operations and its StepInput (moved to host memory for the broadcast), and runs the forward with
it, taking part in the collectives inside. Logits stay with rank 0 (the head gathers them on every rank; the workers'
copies are dropped). torch.distributed carries both the control messages (broadcast_object_list) and the model's
collectives: gloo on the CPU, NCCL on GPUs (one device per rank: cuda:rank).

Data-parallel attention (DEP, `data_parallel=True`): the ranks form data-parallel groups of `tp_size` consecutive
ranks (rank r: group r // tp_size, TP rank r % tp_size), each group with its own requests and KV pools (replicated over
its TP ranks, as under TP alone), every rank with its share of the routed experts. Rank 0's engine schedules every
group's batch and scatters each worker its group's slot operations and StepInput (None: no requests this step; the
group then only joins the MoE exchanges, models/v4/moe.dep_idle) with the step's largest per-group token count; after
the forward every rank's logits rows are gathered to rank 0, which samples each group's (its first rank's) together.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from . import allreduce
from .parallel import TensorParallel

log = logging.getLogger("v4serve.dist")


_on_rank_death: Callable[[str], None] | None = None


def on_rank_death(callback: Callable[[str], None] | None) -> None:
    """What rank 0's process does when a worker rank it spawned exits unexpectedly (the engine server's process: report
    it and exit, so that /health fails at once instead of the next collective failing, or under NCCL hanging until its
    timeout). Unset: the death is logged and the other workers are stopped."""
    global _on_rank_death
    _on_rank_death = callback


class RankWatch(threading.Thread):
    """Polls the worker processes rank 0 spawned (twice a second) until stopped; the first that exits unexpectedly is
    reported (logged, the other workers killed, the `on_rank_death` callback called with the reason)."""

    def __init__(self, procs: list[subprocess.Popen], first_rank: int) -> None:
        super().__init__(name="v4serve-rank-watch", daemon=True)
        self.procs, self.first_rank = procs, first_rank
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(0.5):
            for i, p in enumerate(self.procs):
                code = p.poll()
                if code is None or self.stopped.is_set():
                    continue
                reason = f"rank {self.first_rank + i} (process {p.pid}) exited with code {code}"
                log.error("%s: stopping the other ranks", reason)
                for q in self.procs:
                    if q.poll() is None:
                        q.kill()
                if _on_rank_death is not None:
                    _on_rank_death(reason)
                return


def check_devices(device: torch.device, ranks_here: int, available: int | None = None) -> None:
    """Ranks of one machine run on cuda:0 .. cuda:(ranks_here - 1): there must be that many GPUs, and rank 0 (the
    engine's --device) must be cuda:0. Raises ValueError saying what to change."""
    if device.type != "cuda":
        return
    n = torch.cuda.device_count() if available is None else available
    if ranks_here > n:
        raise ValueError(f"{ranks_here} ranks on this machine need {ranks_here} GPUs (one each, cuda:0 .. "
                         f"cuda:{ranks_here - 1}); it has {n}: lower --tensor-parallel-size / --data-parallel-size, or "
                         "spread the ranks over more machines (--nnodes)")
    if device.index not in (None, 0):
        raise ValueError(f"under --tensor-parallel-size / --data-parallel-size rank r runs on cuda:r, rank 0 on "
                         f"cuda:0; --device {device} would share a GPU with another rank: use --device cuda (or "
                         "CUDA_VISIBLE_DEVICES to choose the GPUs)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _device_for(local_rank: int, device: torch.device) -> torch.device:
    return torch.device("cuda", local_rank) if device.type == "cuda" else device


def _to(step: Any, device: torch.device) -> Any:
    """A StepInput with every tensor on `device`, each its own copy (a step's tensors are views of one packed buffer,
    which pickling would otherwise send once per view)."""
    moved = {f.name: getattr(step, f.name) for f in dataclasses.fields(step)}
    for k, v in moved.items():
        if isinstance(v, torch.Tensor):
            moved[k] = v.to(device, copy=True)
    return type(step)(**moved)


def _on_cpu(inp: Any) -> Any:
    """A GraphInput (engine/graphs.py) to send: its Engram history (computed on rank 0's device) in host memory."""
    eng = inp.engram_prev_ids
    return dataclasses.replace(inp, engram_prev_ids=None if eng is None else eng.cpu())


def _send(msg: Any) -> Any:
    box = [msg]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _scatter(msgs: list | None) -> Any:
    """DEP: rank 0 hands rank r msgs[r] (the others pass None)."""
    box = [None]
    dist.scatter_object_list(box, msgs, src=0)
    return box[0]


def gather_logits(logits: torch.Tensor | None, rows: int, vocab: int, dtype: torch.dtype, device: torch.device,
                  size: int) -> list[torch.Tensor] | None:
    """DEP: every rank's logits, padded to `rows` (the step's largest per-rank count), gathered on rank 0 (a list in
    rank order there, None elsewhere)."""
    buf = torch.zeros(rows, vocab, dtype=dtype, device=device)
    if logits is not None:
        buf[:logits.shape[0]] = logits
    parts = [torch.empty_like(buf) for _ in range(size)] if dist.get_rank() == 0 else None
    dist.gather(buf, parts, dst=0)
    return parts


class TensorParallelPeers:
    """Rank 0's handle on the other ranks: start them, hand them the cache geometry, replay each step, stop them."""

    def __init__(self, size: int, model: str, build_kwargs: dict, device: torch.device, nnodes: int = 1,
                 master_addr: str | None = None, master_port: int | None = None, expert_parallel: bool = False,
                 data_parallel: bool = False, spawn: bool = True, tp_size: int = 1):
        """spawn=False: the other ranks were started by a launcher (torchrun, dist/launcher.py) and join by themselves.
        tp_size: the TP ranks of a data-parallel group under DEP."""
        self.size = size
        self.device = device
        self.data_parallel = data_parallel
        self.tp_size = tp_size
        addr = master_addr or os.environ.get("MASTER_ADDR", "127.0.0.1")
        # one machine spawning its own ranks: a fresh port for each engine (the MASTER_PORT an earlier engine of this
        # process left in the environment may still be held by its store, whose stale keys a new rendezvous would
        # read); a launcher's ranks and other nodes meet at the agreed one
        shared = not spawn or nnodes > 1
        port = str(master_port or (os.environ.get("MASTER_PORT") if shared else None) or _free_port())
        # this node's other ranks (1 .. size/nnodes - 1); the other nodes start theirs (`serve --node-rank k`)
        per_node = size // nnodes
        if spawn:
            check_devices(device, per_node)
        self.procs = spawn_ranks(range(1, per_node), size, addr, port, model, build_kwargs, device, per_node,
                                 expert_parallel, data_parallel, self.tp_size) if spawn else []
        self.watch = RankWatch(self.procs, 1)  # a worker that dies is noticed at once, not at the next collective
        self.watch.start()
        os.environ.update(MASTER_ADDR=addr, MASTER_PORT=port)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=size)
        self.tp = _layout(0, size, expert_parallel, data_parallel, self.tp_size)
        groups = f", {size // self.tp_size} groups of {self.tp_size} TP ranks" if data_parallel and self.tp_size > 1 \
            else ""
        log.info("%s: %d ranks (%s)%s, worker processes %s",
                 "data parallel + expert parallel (DEP)" if data_parallel else "tensor parallel", size,
                 dist.get_backend(), groups, ", ".join(str(p.pid) for p in self.procs))

    @staticmethod
    def serve_node(node_rank: int, nnodes: int, size: int, model: str, build_kwargs: dict, device: torch.device,
                   master_addr: str, master_port: int, expert_parallel: bool = False,
                   data_parallel: bool = False, tp_size: int = 1) -> int:
        """A node other than the first (`serve --node-rank k`): run its ranks until rank 0 stops them. `size`: the
        world size (TP ranks, or DEP's data-parallel groups x their TP ranks)."""
        if size % nnodes or not 0 < node_rank < nnodes:
            raise ValueError(f"--node-rank {node_rank} of --nnodes {nnodes} with a world of {size} ranks: the ranks "
                             "must split evenly over the nodes and node ranks run 1 .. nnodes-1 here (node 0 serves)")
        per_node = size // nnodes
        check_devices(device, per_node)
        procs = spawn_ranks(range(node_rank * per_node, (node_rank + 1) * per_node), size, master_addr,
                            str(master_port), model, build_kwargs, device, per_node, expert_parallel, data_parallel,
                            tp_size)
        log.info("node %d of %d: %s ranks %d..%d (processes %s), waiting for rank 0 at %s:%d", node_rank, nnodes,
                 "data-parallel (DEP)" if data_parallel else "tensor-parallel", node_rank * per_node,
                 (node_rank + 1) * per_node - 1, ", ".join(str(p.pid) for p in procs), master_addr, master_port)
        codes = [p.wait() for p in procs]
        return max(codes, default=0)

    def _post(self, msg: Any) -> None:
        if self.data_parallel:
            _scatter([msg] * self.size)
        else:
            _send(msg)

    def init_cache(self, spec_args: dict, num_blocks: int, num_slots: int) -> None:
        self._post(("cache", spec_args, num_blocks, num_slots))

    def step(self, slot_ops: list, step: Any) -> None:
        """Before rank 0's own forward: the workers start the same one (they block in its first collective)."""
        _send(("step", slot_ops, _to(step, torch.device("cpu"))))

    def capture_graphs(self, graph_args: dict) -> None:
        """Before rank 0 captures its decode graphs: the workers capture theirs, bucket for bucket (the warm-up forwards
        and the captures contain the collectives, so every rank runs the same sequence)."""
        self._post(("graphs", graph_args))

    def replay(self, slot_ops: list, inp: Any) -> None:
        """Before rank 0's replay of a decode graph: the workers load the same inputs (engine/graphs.GraphInput) into
        their own graph's buffers and replay it."""
        _send(("replay", slot_ops, _on_cpu(inp)))

    def _scatter_groups(self, work: list[tuple[list, Any]], message: Callable[[list, Any], tuple]) -> None:
        """DEP: group g's work -> message(*work[g]) to each of its ranks but rank 0 (group 0's message is built only
        when the group has other ranks)."""
        msgs = [message(*w) if g or self.tp_size > 1 else None for g, w in enumerate(work)]
        _scatter([None] + [msgs[r // self.tp_size] for r in range(1, self.size)])

    def replay_dp(self, work: list[tuple[list, Any]], logit_rows: int, logits_dtype: torch.dtype) -> None:
        """DEP, before rank 0's replay: group g's ranks get work[g] = (its slot ops, its GraphInput of the step's
        bucket), replay their graphs and send their logits rows (padded to `logit_rows`) to rank 0."""
        self._scatter_groups(work, lambda ops, inp: ("dreplay", ops, _on_cpu(inp), logit_rows, logits_dtype))

    def step_dp(self, work: list[tuple[list, Any]], tokens: int, logit_rows: int, logits_dtype: torch.dtype) -> None:
        """DEP, before rank 0's own forward: group g's ranks get work[g] = (its slot ops, its StepInput or None), the
        step's largest per-group token count and logits row count (every rank pads to them)."""
        cpu = torch.device("cpu")
        self._scatter_groups(work, lambda ops, st: ("dstep", ops, None if st is None else _to(st, cpu), tokens,
                                                    logit_rows, logits_dtype))

    def gather_logits(self, logits: torch.Tensor | None, rows: int, vocab: int, dtype: torch.dtype
                      ) -> list[torch.Tensor]:
        """Every data-parallel group's logits rows (its first rank's: a group's TP ranks hold the same), in order."""
        return gather_logits(logits, rows, vocab, dtype, self.device, self.size)[::self.tp_size]

    def close(self) -> None:
        self.watch.stopped.set()  # the workers exit now: not a death
        if not dist.is_initialized():
            return
        try:
            self._post(("stop",))
        finally:
            allreduce.forget()
            dist.destroy_process_group()
            for p in self.procs:
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()


def spawn_ranks(ranks: range, size: int, addr: str, port: str, model: str, build_kwargs: dict,
                device: torch.device, per_node: int, expert_parallel: bool = False,
                data_parallel: bool = False, tp_size: int = 1) -> list[subprocess.Popen]:
    """Worker processes for `ranks`, on cuda:(rank % per_node) (plain subprocesses rather than multiprocessing: the engine itself runs in a
    daemon process, engine/core.py, which multiprocessing forbids to have children)."""
    procs = []
    for r in ranks:
        with tempfile.NamedTemporaryFile("wb", suffix=".pkl", delete=False) as f:
            pickle.dump((r, size, addr, port, model, build_kwargs, str(device), per_node, expert_parallel,
                         data_parallel, tp_size), f)
        procs.append(subprocess.Popen([sys.executable, "-m", "v4serve.dist.workers", f.name]))
    return procs


def _layout(rank: int, size: int, expert_parallel: bool, data_parallel: bool, tp_size: int = 1) -> TensorParallel:
    """This rank's place: a tensor-parallel rank, or (DEP) TP rank r % tp_size of data-parallel group r // tp_size,
    whose MoE spreads the experts over all `size` ranks. With both sizes above 1 this makes the process groups (a
    collective: every rank calls it, in the same order), each group's TP ranks and each TP rank's peers across the
    groups; where one of them is the whole world it is the default group."""
    if not data_parallel:
        return TensorParallel(rank, size, expert_parallel=expert_parallel)
    tp = tp_size
    if size % tp:
        raise ValueError(f"{size} ranks do not form data-parallel groups of {tp} tensor-parallel ranks")
    dp = size // tp
    tp_group = dp_group = None
    if tp > 1 and dp > 1:
        tp_groups = [dist.new_group(list(range(g * tp, (g + 1) * tp))) for g in range(dp)]
        dp_groups = [dist.new_group(list(range(t, size, tp))) for t in range(tp)]
        tp_group, dp_group = tp_groups[rank // tp], dp_groups[rank % tp]
    return TensorParallel(rank % tp, tp, group=tp_group, expert_parallel=True, dp_rank=rank // tp, dp_size=dp,
                          dp_group=dp_group)


def run_rank(rank: int, size: int, addr: str, port: str, model: str, build_kwargs: dict, device: str,
             per_node: int = 0, expert_parallel: bool = False, data_parallel: bool = False, tp_size: int = 1) -> None:
    """One rank other than 0: build its share of the model, then replay rank 0's steps until it says stop (a spawned
    worker process, or a process torchrun started: server/launch.py)."""
    from ..cache.pool import KVPools
    from ..cache.spec import make_cache_spec
    from ..engine.runner import apply_slot_ops
    from ..models.factory import build_model
    from ..models.v4.moe import dep_idle
    from .parallel import dep_step

    torch.set_num_threads(max(1, torch.get_num_threads() // size))
    os.environ.update(MASTER_ADDR=addr, MASTER_PORT=port)
    dev = _device_for(rank % per_node if per_node else rank, torch.device(device))
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", rank=rank, world_size=size)
    try:
        lm = build_model(model, device=dev, tp=_layout(rank, size, expert_parallel, data_parallel, tp_size),
                         **build_kwargs)
        pools = graphs = None
        with torch.inference_mode():
            while True:
                msg = _scatter(None) if data_parallel else _send(None)
                if msg[0] == "stop":
                    break
                if msg[0] == "cache":
                    _, spec_args, num_blocks, num_slots = msg
                    pools = KVPools(make_cache_spec(lm.config, **spec_args), num_blocks, num_slots, dev)
                elif msg[0] == "step":
                    _, ops, step = msg
                    apply_slot_ops(pools, ops, dev)
                    lm.model(_to(step, dev), pools)
                elif msg[0] == "graphs":
                    from ..engine.graphs import DecodeGraphs

                    graphs = DecodeGraphs(lm.model, pools, device=dev, **msg[1])
                    graphs.capture()
                elif msg[0] == "replay":
                    _, ops, inp = msg
                    apply_slot_ops(pools, ops, dev)
                    graphs.replay(inp)
                elif msg[0] == "dreplay":
                    _, ops, inp, rows, dtype = msg
                    apply_slot_ops(pools, ops, dev)
                    logits = graphs.replay(inp)
                    gather_logits(logits, rows, lm.config.vocab_size, dtype, dev, size)
                elif msg[0] == "dstep":
                    _, ops, step, tokens, rows, dtype = msg
                    apply_slot_ops(pools, ops, dev)
                    logits = None
                    with dep_step(tokens):
                        if step is None:
                            dep_idle(lm.model, tokens)
                        else:
                            logits = lm.model(_to(step, dev), pools).logits
                    if rows:
                        gather_logits(logits, rows, lm.config.vocab_size, dtype, dev, size)
    finally:
        allreduce.forget()
        dist.destroy_process_group()


if __name__ == "__main__":  # a worker: python -m v4serve.dist.workers ARGS.pkl (written by TensorParallelPeers)
    with open(sys.argv[1], "rb") as f:
        worker_args = pickle.load(f)
    os.unlink(sys.argv[1])
    run_rank(*worker_args)
