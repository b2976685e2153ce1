"""LLMEngine: model + KV pools + scheduler + runner + output processing, stepped synchronously.

`add_request` validates and queues; `step()` runs one batched forward and returns every request's progress.
The offline `LLM` class and the engine-core process (engine/core.py) both drive this object.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass

import torch

from ..cache.manager import CacheGeometry, KVCacheManager
from ..cache.pool import KVPools
from ..cache.spec import CacheSpec, make_cache_spec
from ..models import footprint
from ..models.factory import LoadedModel, build_model
from ..tokenizer import Tokenizer
from . import async_steps
from .config import EngineConfig, EngineConfigError
from .guided_admission import GrammarAdmission
from .itl_budget import PrefillBudget, PrefillGate, gate_steps
from .memory import GRAPHS_AND_ALLOCATOR, activation_reserve
from .output import OutputProcessor
from .request import FinishReason, Request, StepDelta
from .runner import ModelRunner
from .sampler import fresh_seeds
from .sampling_params import SamplingParams
from .scheduler import Scheduler
from .step_stats import StepStats

log = logging.getLogger("v4serve.engine")

CPU_DEFAULT_KV_MEMORY = 256 << 20
DEFAULT_MAX_MODEL_LEN = 65536
AGENTX_SESSION_TOKENS = 142_000


class RequestError(ValueError):
    """A request the engine refuses (too long, bad token ids, bad sampling params): the message says why."""


@dataclass
class Capacity:
    num_blocks: int
    num_slots: int
    num_checkpoints: int
    kv_bytes: int
    max_model_len: int

    def tokens(self, block_size: int) -> int:
        return self.num_blocks * block_size

    def sessions(self, block_size: int, session_tokens: int = AGENTX_SESSION_TOKENS) -> int:
        return min(self.num_blocks // -(-session_tokens // block_size), self.num_slots)


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    table = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32, "fp32": torch.float32,
             "float16": torch.float16, "float64": torch.float64, "fp64": torch.float64}
    if dtype not in table:
        raise EngineConfigError(f"--dtype must be auto, bfloat16, float32 or float64, got {dtype!r}")
    return table[dtype]


def plan_capacity(spec: CacheSpec, cfg: EngineConfig, budget: int, max_position: int) -> Capacity:
    """Split a byte budget between per-request slots (windows + compressor state) and paged blocks."""
    n_ckpt = 0
    bounded = bool(cfg.swa_bounded_replay)
    if cfg.enable_prefix_caching and not bounded:
        n_ckpt = cfg.num_window_checkpoints if cfg.num_window_checkpoints is not None else cfg.max_num_seqs
    slots = cfg.max_num_seqs + n_ckpt
    slot_bytes = (slots + 1) * spec.slot_bytes()
    block_bytes = max(1, spec.block_bytes())
    num_blocks = (budget - slot_bytes) // block_bytes - 1
    if num_blocks < 1:
        raise EngineConfigError(
            f"--kv-cache-memory / --gpu-memory-utilization leave {budget / 2**20:.1f} MiB for the KV cache, but "
            f"{slots} slots need {slot_bytes / 2**20:.1f} MiB before any block ({block_bytes / 2**20:.2f} MiB each); "
            "give the cache more memory or lower --max-num-seqs / --num-window-checkpoints")
    cap_tokens = num_blocks * spec.block_size
    mml = cfg.max_model_len or min(max_position, DEFAULT_MAX_MODEL_LEN, cap_tokens)
    if mml > max_position:
        raise EngineConfigError(f"--max-model-len {mml} exceeds the model's {max_position} positions")
    if mml > cap_tokens:
        raise EngineConfigError(f"--max-model-len {mml} needs {-(-mml // spec.block_size)} blocks but the cache holds "
                                f"{num_blocks}; raise --kv-cache-memory or lower --max-model-len")
    return Capacity(int(num_blocks), slots, n_ckpt, int(budget), int(mml))


class LLMEngine:
    def __init__(self, model: str, config: EngineConfig | None = None, loaded: LoadedModel | None = None):
        cfg = config or EngineConfig()
        self.cfg = cfg
        self.device = resolve_device(cfg.device)
        self.dtype = resolve_dtype(cfg.dtype, self.device)
        t0 = time.monotonic()
        build_kwargs = dict(seed=cfg.seed, numerics=cfg.numerics, dtype=self.dtype, with_mtp=cfg.with_mtp,
                            kernels=cfg.kernels)
        self.peers = None
        self.dp = cfg.data_parallel_size  # DEP: data-parallel ranks, each with its own scheduler and KV cache
        if cfg.tensor_parallel_size > 1 or self.dp > 1:
            if loaded is not None:
                raise EngineConfigError("--tensor-parallel-size / --data-parallel-size > 1 build each rank's model "
                                        "itself; pass a model name")
            from ..dist.workers import TensorParallelPeers

            from ..models.factory import resolve_config

            layout_config = resolve_config(model)[0]  # a layout that cannot run fails here, before any worker starts
            if cfg.tensor_parallel_size > 1 and cfg.with_mtp and layout_config.is_v41:  # (factory.py refuses it too)
                raise EngineConfigError("--tensor-parallel-size > 1 does not load V4.1's DSpark draft blocks yet "
                                        "(with_mtp=False)")
            if self.dp > 1:
                from ..models.sharding import Layout, check_layout

                try:
                    check_layout(layout_config, Layout(cfg.tensor_parallel_size, self.dp, True))
                except ValueError as e:
                    raise EngineConfigError(f"--data-parallel-size {self.dp} --tensor-parallel-size "
                                            f"{cfg.tensor_parallel_size} --enable-expert-parallel: {e}") from None
            self.peers = TensorParallelPeers(cfg.tensor_parallel_size * self.dp, model, build_kwargs, self.device,
                                             cfg.nnodes, cfg.master_addr, cfg.master_port,
                                             cfg.enable_expert_parallel, data_parallel=self.dp > 1,
                                             spawn=not cfg.external_launcher, tp_size=cfg.tensor_parallel_size)
        tp = self.peers.tp if self.peers is not None else None
        self.loaded = loaded or build_model(model, device=self.device, tp=tp, **build_kwargs)
        mc = self.model_config = self.loaded.config
        if cfg.swa_bounded_replay is None:
            cfg.swa_bounded_replay = mc.is_v41
        if cfg.swa_bounded_replay and not mc.is_v41:
            raise EngineConfigError("--swa-bounded-replay is a DeepSeek-V4.1 technique; V4 models serve prefix hits "
                                    "exactly (window checkpoints or exact replay)")
        self.tokenizer = Tokenizer.from_pretrained(self.loaded.folder)
        self.spec = make_cache_spec(mc, cfg.block_size, cfg.kv_cache_dtype, cfg.index_cache_dtype, self.dtype,
                                    with_mtp=cfg.with_mtp)
        self.capacity = plan_capacity(self.spec, cfg, self._kv_budget(), mc.max_position)
        self.max_model_len = self.capacity.max_model_len
        self.pools = KVPools(self.spec, self.capacity.num_blocks, self.capacity.num_slots, self.device)
        if self.peers is not None:  # TP: every rank keeps the same cache (one KV head: replicated); DEP: each its own
            self.peers.init_cache(dict(block_size=cfg.block_size, kv_dtype=cfg.kv_cache_dtype,
                                       index_dtype=cfg.index_cache_dtype, compute_dtype=self.dtype,
                                       with_mtp=cfg.with_mtp), self.capacity.num_blocks, self.capacity.num_slots)
        ratios = tuple(sorted({mc.compress_ratios[i] for i in mc.compressed_layers}))
        geom = CacheGeometry(cfg.block_size, mc.window_size, mc.n_layers, ratios)
        # one KV cache manager and scheduler per data-parallel rank (one without DEP); rank r's pools live on rank r
        self.kvs = [KVCacheManager(geom, self.capacity.num_blocks, cfg.max_num_seqs, self.capacity.num_checkpoints,
                                   cfg.enable_prefix_caching, bool(cfg.swa_bounded_replay)) for _ in range(self.dp)]
        self.schedulers = [Scheduler(kv, cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.prefill_chunk,
                                     cfg.block_size, mc.window_size,
                                     align_chunks=self.capacity.num_checkpoints > 0,
                                     decoder_trim=mc.is_v41 and bool(cfg.swa_bounded_replay),
                                     prefill_budget=PrefillBudget(cfg.prefill_budget_with_decodes, cfg.target_itl_ms,
                                                                  minimum=cfg.block_size),
                                     prefill_gate=PrefillGate(gate_steps(cfg.decode_steps_between_prefills,
                                                                         self._graphed_decode()),
                                                              cfg.max_prefill_delay_ms),
                                     lone_chunk=cfg.lone_prefill_chunk)
                           for kv in self.kvs]
        self.kv, self.scheduler = self.kvs[0], self.schedulers[0]
        self.router = None
        if self.dp > 1:
            from .dp_router import DataParallelRouter

            self.router = DataParallelRouter(self.dp, cfg.block_size)
        graphs = graph_args = None
        # decode graphs on a GPU (under TP and DEP too, where turned on: every rank captures its own, collectives
        # inside), or their eager stand-ins where asked (tests of the graphed path on the CPU)
        from .graphs import DecodeGraphs

        if self._graphed_decode() or cfg.graph_stand_ins:
            engram = mc.engram_max_ngram - 1 if mc.is_v41 and mc.engram_layers else 0
            graph_args = dict(sizes=cfg.cuda_graph_sizes, max_model_len=self.max_model_len,
                              num_blocks=self.capacity.num_blocks, block_size=cfg.block_size, engram_lookback=engram,
                              stand_ins=self.device.type != "cuda", thread_local=self.peers is not None,
                              data_parallel=self.dp > 1)
            graphs = DecodeGraphs(self.loaded.model, self.pools, device=self.device, **graph_args)
        self.runner = ModelRunner(self.loaded.model, self.pools, mc.vocab_size, mc.eos_token_id, self.device,
                                  self.max_model_len, graphs)
        self.runner.peers = self.peers
        if mc.is_v41:
            from ..models.v41.engine_hooks import make_step_hook

            self.runner.step_hook = make_step_hook(self.loaded.model, mc, self.tokenizer)
        if graphs is not None:
            if self.peers is not None:
                self.peers.capture_graphs(graph_args)
            if cfg.chunk_graph_tokens and self.peers is None and self.dp == 1:
                from .chunk_graphs import ChunkGraphs

                chunk_args = {k: v for k, v in graph_args.items() if k not in ("sizes", "thread_local", "data_parallel")}
                self.runner.chunk_graphs = ChunkGraphs(self.loaded.model, self.pools, cfg.chunk_graph_tokens,
                                                       cfg.max_num_seqs + 1, device=self.device,
                                                       trimmed=self.schedulers[0].decoder_trim, **chunk_args)
                self.runner.chunk_graphs.capture()
                graphs.pool = self.runner.chunk_graphs.pool  # one memory pool: the steps replay one at a time
            graphs.capture()
        if cfg.chunk_graph_tokens and self.runner.chunk_graphs is None:
            log.warning("--chunk-graph-tokens ignored: chunk graphs need CUDA graphs (a GPU without --enforce-eager) "
                        "and one rank; prompt steps run eagerly")
        self.grammars = GrammarAdmission(self.tokenizer, mc.vocab_size)
        self.last_step_tokens = 0  # tokens the last step computed (reported to the server's metrics)
        self.last_step_rows = 0  # and its rows (the engine loop's slow-step warning)
        self.step_stats = StepStats()  # step times by kind (decode / mixed / prefill): the stats line, /metrics
        self.requests: dict[str, Request] = {}
        self.outputs: dict[str, OutputProcessor] = {}
        self._ended: list[Request] = []  # aborted outside a step: reported by the next step
        self._inflight: async_steps.InFlight | None = None  # async scheduling: the launched step not yet read
        self._async = cfg.async_scheduling and self.peers is None and self.dp == 1
        self.load_seconds = time.monotonic() - t0
        log.info(footprint.describe(self.loaded.model, mc, cfg.with_mtp))
        log.info(self.describe_capacity())

    # --- capacity -----------------------------------------------------------------------------------
    def _kv_budget(self) -> int:
        if self.cfg.kv_cache_memory is not None:
            return self.cfg.kv_cache_memory
        if self.device.type != "cuda":
            return CPU_DEFAULT_KV_MEMORY
        free, total = torch.cuda.mem_get_info(self.device)
        used = total - free
        reserve = self._activation_reserve()
        return int(self.cfg.gpu_memory_utilization * total - used - reserve)

    def _activation_reserve(self) -> int:
        """Activation memory of the largest step, kept out of the KV budget (engine/memory.py); with chunk graphs
        also their largest bucket's, which their memory pool keeps beside the eager steps' allocations."""
        toks = min(self.cfg.max_num_batched_tokens, self.cfg.max_model_len or DEFAULT_MAX_MODEL_LEN)
        experts = footprint.fp4_routed_experts(self.loaded.model)
        reserve = activation_reserve(self.loaded.config, toks, experts)
        if self.cfg.chunk_graph_tokens and not self.cfg.enforce_eager:
            reserve += activation_reserve(self.loaded.config, max(self.cfg.chunk_graph_tokens), experts) \
                - GRAPHS_AND_ALLOCATOR
        return reserve

    def close(self) -> None:
        """Stop the tensor-parallel workers (if any); the engine cannot step afterwards."""
        if self.peers is not None:
            self.peers.close()
            self.peers = self.runner.peers = None

    def describe_capacity(self) -> str:
        c, B = self.capacity, self.cfg.block_size
        by = self.spec.by_kind()
        return (f"KV cache: {c.num_blocks} blocks of {B} positions = {c.tokens(B):,} tokens "
                f"({by['total_per_token']:.2f} B/token: {by['compressed_entries_per_token']:.2f} compressed + "
                f"{by['index_keys_per_token']:.2f} index keys; window+state {self.spec.slot_bytes() / 2**20:.2f} "
                f"MiB per slot, {c.num_slots} slots incl. {c.num_checkpoints} window checkpoints); "
                f"fits {c.sessions(B)} AgentX-median sessions of {AGENTX_SESSION_TOKENS:,} tokens; "
                f"max_model_len {c.max_model_len:,}")

    # --- requests -----------------------------------------------------------------------------------
    def add_request(self, prompt_token_ids: list[int], params: SamplingParams, request_id: str | None = None,
                    cache_salt: str | None = None, trim_target: int | None = None) -> list[str]:
        """Queue a request (n > 1: n sibling requests sharing the prompt). Returns the engine request ids."""
        request_id = request_id or uuid.uuid4().hex
        self.validate(prompt_token_ids, params)
        if request_id in self.requests or any(k.startswith(request_id + "#") for k in self.requests):
            raise RequestError(f"request id {request_id!r} is already in use")
        ids = [request_id] if params.n == 1 else [f"{request_id}#{i}" for i in range(params.n)]
        base_seed = params.seed
        seeds = fresh_seeds(len(ids)) if base_seed is None else [base_seed + i for i in range(len(ids))]
        max_new = self.max_model_len - len(prompt_token_ids)
        rank = 0 if self.router is None else self.router.pick(
            prompt_token_ids, cache_salt, self.loads(), lambda r, h: self.kvs[r].pool.lookup(h) is not None)
        for rid, seed in zip(ids, seeds):
            p = params if params.max_tokens is not None else params.clone(max_tokens=max_new)
            req = Request(rid, list(prompt_token_ids), p, cache_salt=cache_salt, seed=seed, trim_target=trim_target)
            req.dp_rank = rank
            self.requests[rid] = req
            self.outputs[rid] = OutputProcessor(req, self.tokenizer, self.model_config.eos_token_id,
                                                self.max_model_len)
            if p.structured_outputs is not None:
                self.grammars.add(req, p.structured_outputs)
            self.schedulers[rank].add(req)
        return ids

    def loads(self) -> list[int]:
        """Per data-parallel rank: tokens (prompt + output so far) of its running and waiting requests."""
        return [sum(r.num_tokens for r in s.running) + sum(r.num_tokens for r in s.waiting) for s in self.schedulers]

    def validate(self, prompt: list[int], params: SamplingParams) -> None:
        if not prompt:
            raise RequestError("the prompt is empty: send at least one token")
        V = self.model_config.vocab_size
        bad = [t for t in prompt if not isinstance(t, int) or not 0 <= t < V]
        if bad:
            raise RequestError(f"prompt token id(s) {bad[:5]} are outside the vocabulary [0, {V})")
        try:
            params.validate(V)
        except ValueError as e:
            raise RequestError(str(e)) from None
        if len(prompt) >= self.max_model_len:
            raise RequestError(f"the prompt has {len(prompt)} tokens; this server's context is {self.max_model_len} "
                               "tokens (--max-model-len) and a prompt must leave room for one output token")
        if params.max_tokens is not None and len(prompt) + params.max_tokens > self.max_model_len:
            raise RequestError(f"max_tokens ({params.max_tokens}) plus the prompt ({len(prompt)} tokens) exceeds the "
                               f"context of {self.max_model_len} tokens; lower max_tokens to at most "
                               f"{self.max_model_len - len(prompt)}")

    def abort(self, request_id: str) -> None:
        for rid in [request_id] + [k for k in self.requests if k.startswith(request_id + "#")]:
            req = self.requests.get(rid)
            if req is not None and not req.is_finished:
                self.schedulers[req.dp_rank].abort(req)
                req.finished_time = time.monotonic()
                self._ended.append(req)

    def _graphed_decode(self) -> bool:
        """Whether decode steps run as CUDA graphs (a GPU without --enforce-eager; under TP and DEP where turned on)."""
        from .graphs import multi_rank_graphs

        return self.device.type == "cuda" and not self.cfg.enforce_eager and (self.peers is None or
                                                                             multi_rank_graphs())

    def has_unfinished(self) -> bool:
        return any(s.num_unfinished > 0 for s in self.schedulers) or self._inflight is not None

    # --- stepping -------------------------------------------------------------------------------------
    def step(self) -> list[StepDelta]:
        ended, self._ended = self._ended, []
        deltas: list[StepDelta] = [self._finish_delta(req) for req in ended if req.request_id in self.outputs]
        if self.grammars.pending:
            for req, reason in self.grammars.resolve():
                self.schedulers[req.dp_rank].finish(req, FinishReason.ERROR)
                req.error, req.finished_time = reason, time.monotonic()
                deltas.append(self._finish_delta(req))
        if self._async and self.runner.logits_tap is None and async_steps.eligible(self.requests.values()):
            return deltas + self._step_async()
        if self._inflight is not None:  # a request that needs its tokens on the host came: read the launched step
            deltas += self._take(self._inflight)
            self._inflight = None
        scheds = [s.schedule() for s in self.schedulers]  # DEP: every data-parallel rank's own batch
        for sched in scheds:
            for req in sched.failed:
                req.finished_time = time.monotonic()
                deltas.append(self._finish_delta(req))
        if all(sched.empty for sched in scheds):
            for s, sched in zip(self.schedulers, scheds):  # no forward: slot ops wait for the next one, in order
                s.kv.pending[:0] = sched.slot_ops
            if self.grammars.pending and not deltas:
                self.grammars.wait(0.01)  # only compilations left: wait for one instead of spinning
            return deltas
        t_step = time.monotonic()
        if self.dp == 1:
            out = self.runner.execute(scheds[0], self.scheduler.decoder_floor)
        else:
            out = self.runner.execute_dp(scheds, [s.decoder_floor for s in self.schedulers])
        for s, sched in zip(self.schedulers, scheds):
            s.advance(sched)
        now = time.monotonic()
        self.last_step_tokens = sum(sched.num_tokens for sched in scheds)
        self.last_step_rows = sum(len(sched.rows) for sched in scheds)
        all_decodes = 0
        for s, sched in zip(self.schedulers, scheds):
            decodes = sum(1 for r in sched.rows if r.num_tokens == 1)
            s.prefill_budget.observe(decodes, sched.num_tokens - decodes, now - t_step)
            all_decodes += decodes
        # one step of every data-parallel rank together: one observation
        self.step_stats.observe(all_decodes, self.last_step_tokens - all_decodes, now - t_step)
        starts = {r.request.request_id: r.start for sched in scheds for r in sched.rows}
        for rid, entries in out.prompt_logprobs.items():
            req = self.requests[rid]
            # entry i scores prompt token i; positions served from the prefix cache have none
            need = starts[rid] + 1
            if len(req.prompt_logprobs) < need:
                req.prompt_logprobs.extend([None] * (need - len(req.prompt_logprobs)))
            del req.prompt_logprobs[need:]  # a preempted request recomputes: its entries replace the first ones
            req.prompt_logprobs.extend(entries)
        for s in out.sampled:
            delta = self._token(s.request, s.token_id, s.top, now)
            if delta is not None:
                deltas.append(delta)
        return deltas

    def _token(self, req: Request, token_id: int, top: dict[int, float] | None, now: float) -> StepDelta | None:
        """One sampled token of a request: output handling, stop checks, its delta (None: the request had ended)."""
        if req.is_finished:
            return None
        proc = self.outputs[req.request_id]
        if req.first_token_time is None:
            req.first_token_time = now
        text, reason, stop_reason = proc.append(token_id, top)
        finished = reason is not None
        if finished:
            self.schedulers[req.dp_rank].finish(req, reason, stop_reason)
            req.finished_time = now
            self.outputs.pop(req.request_id)
        return proc.delta([token_id], text, finished, [top] if top is not None else None)

    def _step_async(self) -> list[StepDelta]:
        """Schedule and launch this step, then read the previous one's tokens while the GPU runs it
        (engine/async_steps.py)."""
        sched = self.scheduler.schedule()
        deltas: list[StepDelta] = []
        for req in sched.failed:
            req.finished_time = time.monotonic()
            deltas.append(self._finish_delta(req))
        prev, self._inflight = self._inflight, None
        launched = None
        if sched.empty:
            self.scheduler.kv.pending[:0] = sched.slot_ops  # no forward: they wait for the next one, in order
        else:
            launched = self.runner.launch(sched, self.scheduler.decoder_floor, prev)
        if prev is not None:
            deltas += self._take(prev)
            # the step's time: from its launch to its tokens on the host (the ITL budget's observation)
            decodes = sum(1 for r in prev.sched.rows if r.num_tokens == 1)
            took = time.monotonic() - prev.launched_at
            self.scheduler.prefill_budget.observe(decodes, prev.sched.num_tokens - decodes, took)
            self.step_stats.observe(decodes, prev.sched.num_tokens - decodes, took)
        if launched is not None:  # its input tokens are all on the host now: account for it, hold its tokens' places
            self.scheduler.advance(sched)
            async_steps.hold_places(launched.reqs)
            self._inflight = launched
            self.last_step_tokens = sched.num_tokens
            self.last_step_rows = len(sched.rows)
        elif self.grammars.pending and not deltas:
            self.grammars.wait(0.01)
        return deltas

    def _take(self, f: async_steps.InFlight) -> list[StepDelta]:
        """A launched step's tokens, read now: each replaces its request's placeholder."""
        now = time.monotonic()
        deltas = []
        for req, token_id in zip(f.reqs, f.tokens()):
            async_steps.drop_place(req)
            delta = self._token(req, token_id, None, now)
            if delta is not None:
                deltas.append(delta)
        return deltas

    def _finish_delta(self, req: Request) -> StepDelta:
        async_steps.drop_place(req)  # ended (aborted, failed) while its last token was still on the GPU
        proc = self.outputs.pop(req.request_id)
        return proc.delta([], "", True)

    def release(self, request_id: str) -> Request | None:
        """Forget a finished request (the caller has read its outputs)."""
        return self.requests.pop(request_id, None)

    # --- introspection ----------------------------------------------------------------------------------
    def stats(self) -> dict[str, object]:
        """Engine counters; under DEP the sums over the data-parallel ranks, and each rank's own in `dp_ranks`."""
        per = [self._rank_stats(s) for s in self.schedulers]
        if self.dp == 1:
            return {**per[0], "step_stats": self.step_stats.as_dict()}
        total: dict[str, object] = {}
        for k, v in per[0].items():
            if isinstance(v, dict):
                merged: dict = {}
                for p in per:
                    for kk, vv in p[k].items():  # type: ignore[union-attr]
                        merged[kk] = merged.get(kk, 0) + vv
                total[k] = merged
            else:
                total[k] = sum(p[k] for p in per)  # type: ignore[misc]
        total["kv_usage"] = total["blocks_used"] / total["blocks_total"]  # type: ignore[operator]
        total["dp_ranks"] = [{k: p[k] for k in ("running", "waiting", "blocks_used", "kv_usage", "prefix_hits",
                                                "preemptions")} for p in per]
        total["dp_routed_by_prefix"] = self.router.by_prefix
        total["dp_routed_by_load"] = self.router.by_load
        total["step_stats"] = self.step_stats.as_dict()
        return total

    def _rank_stats(self, sched: Scheduler) -> dict[str, object]:
        kv = sched.kv
        used = kv.pool.num_blocks - kv.pool.num_free
        return {
            "running": len(sched.running),
            "waiting": len(sched.waiting),
            "preemptions": sched.num_preemptions,
            "blocks_total": kv.pool.num_blocks,
            "blocks_used": used,
            "blocks_cached": kv.pool.num_cached,
            "kv_usage": used / kv.pool.num_blocks,
            "kv_bytes_by_kind": self.kv_bytes_by_kind(used, len(sched.running)),
            "prefix_hits": kv.stats.hits,
            "prefix_misses": kv.stats.misses,
            "prefix_miss_reasons": dict(kv.stats.miss_reasons),
            "prefix_hit_kinds": dict(kv.stats.hit_kinds),
            "prompt_tokens": kv.stats.prompt_tokens,
            "cached_tokens": kv.stats.cached_tokens,
            "replayed_tokens": kv.stats.replayed_tokens,
            "checkpoints": len(kv.checkpoints.by_hash),
            "evictions": kv.pool.evictions,
        }

    def kv_bytes_by_kind(self, used_blocks: int, running: int | None = None) -> dict[str, int]:
        B = self.cfg.block_size
        comp = sum((B // lc.ratio) * lc.compressed.record_bytes for lc in self.spec.layers if lc.compressed)
        idx = sum((B // lc.ratio) * lc.index_keys.record_bytes for lc in self.spec.layers if lc.index_keys)
        running = len(self.scheduler.running) if running is None else running
        return {"compressed": used_blocks * comp, "index_keys": used_blocks * idx,
                "window": running * self.spec.window_bytes_per_seq(),
                "compressor_state": running * self.spec.state_bytes_per_seq()}

    def abort_all(self, reason: FinishReason = FinishReason.ABORT) -> None:
        for req in list(self.requests.values()):
            if not req.is_finished:
                self.schedulers[req.dp_rank].finish(req, reason)
                self._ended.append(req)
