"""Engine options (the vLLM-named CLI flags map 1:1 onto these fields)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

# vLLM's --kv-cache-dtype spellings -> ours
KV_DTYPE_ALIASES = {"bfloat16": "bf16", "fp8_e4m3": "fp8", "fp8_ds_mla": "fp8"}


class EngineConfigError(ValueError):
    """An engine option out of range; the message names the option and what to pass instead."""


@dataclass
class EngineConfig:
    device: str = "auto"  # auto = cuda when available, else cpu
    dtype: str = "auto"  # auto = bfloat16 on cuda, float32 on cpu
    seed: int = 0  # preset weights' seed
    numerics: str = "deepseek"
    block_size: int = 256
    kv_cache_dtype: str = "auto"  # auto | bf16 | fp8 (V4 584 B records) | fp4 (V4.1 288 B entries)
    index_cache_dtype: str | None = None  # auto | bf16 | fp8 (132 B) | fp4 (68 B); None = fp4 with quantized KV
    gpu_memory_utilization: float = 0.9
    kv_cache_memory: int | None = None  # bytes for KV pools; overrides gpu_memory_utilization
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 8192
    long_prefill_token_threshold: int = 0  # per-request prefill tokens per step; 0 = max_num_batched_tokens // 4
    prefill_budget_with_decodes: int = 0  # prefill tokens allowed in a step that has decode rows (0 = no cap)
    target_itl_ms: float = 0.0  # derive that cap from an inter-token-latency target (engine/itl_budget.py; 0 = off)
    # prefill joins decode rows only every N + 1 steps (PrefillGate; 0 = off; None = itl_budget.AUTO_GATE_STEPS where
    # decode steps run as CUDA graphs, else off)
    decode_steps_between_prefills: int | None = None
    max_prefill_delay_ms: float = 150.0  # ... but a prefill pending this long goes in the next step (0 = no bound)
    max_model_len: int | None = None  # None = min(model max positions, what the cache holds)
    enable_prefix_caching: bool = True
    swa_bounded_replay: bool | None = None  # None = on for V4.1, off (exact) for V4
    num_window_checkpoints: int | None = None  # window snapshots kept for exact prefix hits (None = max_num_seqs)
    enforce_eager: bool = False
    # tests: on the CPU, uniform decode steps go through the decode graphs' static buffers and bucket padding, with an
    # eager forward standing in for each CUDA graph (engine/graphs.py; there are no graphs on the CPU)
    graph_stand_ins: bool = False
    # compile the step's kernels at start-up with a short scripted workload (engine/warmup.py); None = when the server
    # starts the engine on a GPU (the offline LLM and the benchmarks run their own warm-up steps)
    warmup: bool | None = None
    # schedule and launch step N+1 before step N's sampled tokens reach the host (engine/async_steps.py): the host's
    # per-step work overlaps the GPU's; each step's tokens are reported one step later. On by default: the graphed
    # V4 step (H200, eleventh session) 9.64 -> 9.45 ms at batch 1, 19.42 -> 17.70 ms at batch 32 (replay 17.50)
    async_scheduling: bool = True
    kernels: str = "auto"  # auto = Triton kernels on CUDA, the plain-torch reference elsewhere (ops/backend.py)
    cuda_graph_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    # token buckets of the CUDA graphs of steps with prompt tokens (engine/chunk_graphs.py); () = those steps run
    # eagerly. Opt-in until their GPU test (tests/gpu/test_cuda.py -k chunk_graphs) has run; world size 1
    chunk_graph_tokens: tuple[int, ...] = ()
    max_queue_len: int = 1024
    with_mtp: bool = False  # load MTP / DSpark blocks (speculative decoding will use them)
    tensor_parallel_size: int = 1  # ranks of one model replica (dist/workers.py); V4 family
    enable_expert_parallel: bool = False  # under TP: routed experts whole on their owner rank (else sliced)
    data_parallel_size: int = 1  # DEP: data-parallel groups of tensor_parallel_size ranks, each its own requests (EP)
    nnodes: int = 1  # machines the ranks span (node 0 runs the engine; `serve --node-rank k` on the others)
    master_addr: str | None = None  # rank 0's address for torch.distributed (default: MASTER_ADDR or 127.0.0.1)
    master_port: int | None = None  # its port (default: MASTER_PORT or a free port, single node only)
    external_launcher: bool = False  # ranks 1.. are started by torchrun (dist/launcher.py), not by the engine

    def __post_init__(self) -> None:
        def bad(name: str, msg: str) -> None:
            raise EngineConfigError(f"--{name.replace('_', '-')}: {msg}")

        if self.block_size <= 0 or self.block_size % 8:
            bad("block_size", f"must be a positive multiple of 8, got {self.block_size}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            bad("gpu_memory_utilization", f"must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.kv_cache_memory is not None and self.kv_cache_memory <= 0:
            bad("kv_cache_memory", f"must be a positive number of bytes, got {self.kv_cache_memory}")
        if self.max_num_seqs < 1:
            bad("max_num_seqs", f"must be at least 1, got {self.max_num_seqs}")
        if not self.cuda_graph_sizes or any(int(b) < 1 for b in self.cuda_graph_sizes):
            bad("cuda_graph_sizes", f"must be positive batch sizes, got {list(self.cuda_graph_sizes)}")
        self.cuda_graph_sizes = tuple(sorted({int(b) for b in self.cuda_graph_sizes}))
        if any(int(t) < 1 for t in self.chunk_graph_tokens):
            bad("chunk_graph_tokens", f"must be positive token counts, got {list(self.chunk_graph_tokens)}")
        self.chunk_graph_tokens = tuple(sorted({int(t) for t in self.chunk_graph_tokens}))
        if self.max_num_batched_tokens < 1:
            bad("max_num_batched_tokens", f"must be at least 1, got {self.max_num_batched_tokens}")
        if self.long_prefill_token_threshold < 0:
            bad("long_prefill_token_threshold", f"must be >= 0, got {self.long_prefill_token_threshold}")
        if self.max_model_len is not None and self.max_model_len < 2:
            bad("max_model_len", f"must be at least 2, got {self.max_model_len}")
        self.kv_cache_dtype = KV_DTYPE_ALIASES.get(self.kv_cache_dtype, self.kv_cache_dtype)
        if self.kv_cache_dtype not in ("auto", "bf16", "fp8", "fp4"):
            bad("kv_cache_dtype", f"must be auto, bf16, fp8 or fp4, got {self.kv_cache_dtype!r}")
        if self.index_cache_dtype not in (None, "auto", "bf16", "fp8", "fp4"):
            bad("index_cache_dtype", f"must be auto, bf16, fp8 or fp4, got {self.index_cache_dtype!r}")
        if self.kernels not in ("auto", "triton", "reference"):
            bad("kernels", f"must be auto, triton or reference, got {self.kernels!r}")
        if self.prefill_budget_with_decodes < 0:
            bad("prefill_budget_with_decodes", f"must be >= 0, got {self.prefill_budget_with_decodes}")
        if self.target_itl_ms < 0:
            bad("target_itl_ms", f"must be >= 0, got {self.target_itl_ms}")
        if self.decode_steps_between_prefills is not None and self.decode_steps_between_prefills < 0:
            bad("decode_steps_between_prefills", f"must be >= 0, got {self.decode_steps_between_prefills}")
        if self.max_prefill_delay_ms < 0:
            bad("max_prefill_delay_ms", f"must be >= 0, got {self.max_prefill_delay_ms}")
        if self.tensor_parallel_size < 1:
            bad("tensor_parallel_size", f"must be at least 1, got {self.tensor_parallel_size}")
        if self.data_parallel_size < 1:
            bad("data_parallel_size", f"must be at least 1, got {self.data_parallel_size}")
        if self.data_parallel_size > 1:
            dp = self.data_parallel_size
            if not self.enable_expert_parallel:
                bad("data_parallel_size", f"{dp} needs --enable-expert-parallel: data-parallel attention runs as DEP "
                    "(each rank its own requests and attention, the routed experts spread over the ranks); pure "
                    "data parallelism with every expert replicated is not supported")
            if self.with_mtp:
                bad("data_parallel_size", "DEP does not load the MTP / DSpark draft blocks yet (with_mtp=False)")
        world = self.tensor_parallel_size * self.data_parallel_size
        if self.nnodes < 1 or world % self.nnodes:
            bad("nnodes", f"must divide the world size (--tensor-parallel-size x --data-parallel-size = {world}), got "
                f"{self.nnodes}")
        if self.nnodes > 1 and (self.master_addr is None or self.master_port is None):
            bad("master_addr", "several nodes need --master-addr and --master-port (rank 0's, reachable from all)")
        if self.max_queue_len < 1:
            bad("max_queue_len", f"must be at least 1, got {self.max_queue_len}")

    @property
    def prefill_chunk(self) -> int:
        return self.long_prefill_token_threshold or max(1, self.max_num_batched_tokens // 4)

    @property
    def lone_prefill_chunk(self) -> int:
        """A prompt's tokens per step when its request is the engine's only one: the whole budget unless a threshold
        was given (the quarter cap keeps a long prompt from holding back others; alone, it only costs per-step work:
        H200, an 8K prompt on v4-flash-e16 took 4 x 232 ms of GPU in 2K chunks, ~790 ms in one)."""
        return self.long_prefill_token_threshold or self.max_num_batched_tokens

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)}

    @classmethod
    def from_kwargs(cls, **kw: Any) -> EngineConfig:
        unknown = set(kw) - cls.field_names()
        if unknown:
            raise EngineConfigError(f"unknown engine option(s): {', '.join(sorted(unknown))}")
        return cls(**kw)
