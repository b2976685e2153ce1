"""A request as the engine tracks it, and what the engine reports back."""

from __future__ import annotations

import enum
import time
from concurrent.futures import Future
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..cache.seq_state import SeqCacheState
from .sampling_params import SamplingParams

if TYPE_CHECKING:
    from .guided import Guide


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(str, enum.Enum):
    STOP = "stop"  # EOS, a stop token id or a stop string
    LENGTH = "length"  # max_tokens or the context limit
    ABORT = "abort"  # the client aborted (or disconnected)
    ERROR = "error"  # the engine could not serve it (e.g. it never fits the KV cache)


@dataclass
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    cache_salt: str | None = None
    arrival_time: float = field(default_factory=time.monotonic)
    seed: int | None = None  # drawn once at admission when params.seed is None
    output_token_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None
    error: str | None = None
    # --- scheduling state (the KV-cache state is `cache`, owned here, written by cache/manager.py) ------
    cache: SeqCacheState = field(default_factory=SeqCacheState)
    prefill_target: int = 0  # tokens known when this prefill started (V4.1 decoder trim; set at admission)
    trim_target: int | None = None  # decoder trim reference length (None: prefill_target; see Scheduler)
    num_preemptions: int = 0
    # async scheduling (engine/async_steps.py): the last output token is a placeholder, sampled on the GPU and not yet
    # read; the next step feeds it from the device
    pending_token: bool = False
    dp_rank: int = 0  # DEP: the data-parallel rank whose scheduler, KV cache and attention serve this request
    # --- structured output (engine/guided_admission.py) ----------------------------------------------
    pending_grammar: Future[Any] | None = None  # compiling: the scheduler does not admit the request yet
    guide: Guide | None = None  # the grammar matcher, once compiled
    # --- outputs -----------------------------------------------------------------------------------
    logprobs: list[dict[int, float]] = field(default_factory=list)
    prompt_logprobs: list[dict[int, float] | None] = field(default_factory=list)
    first_scheduled_time: float | None = None  # first admitted into a step (the end of its queueing)
    first_token_time: float | None = None
    finished_time: float | None = None

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def tokens(self) -> TokenView:
        """Prompt + output without copying them: per-step code reads small slices of 100K-token requests."""
        return TokenView(self.prompt_token_ids, self.output_token_ids)

    @property
    def num_computed(self) -> int:
        """Positions whose KV is in the cache (read-only here: the manager and the scheduler write `cache`)."""
        return self.cache.num_computed

    @property
    def num_cached_tokens(self) -> int:
        """Prompt tokens served from the prefix cache (usage `cached_tokens`)."""
        return self.cache.num_cached_tokens

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status == RequestStatus.FINISHED

    @property
    def ready(self) -> bool:
        """Whether it may be admitted: nothing it needs is still being prepared (its grammar is compiled, and a
        preempted request's last token is on the host)."""
        return self.pending_grammar is None and not self.pending_token

    @property
    def in_prefill(self) -> bool:
        return self.num_tokens - self.num_computed > 1


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    logprobs: list[dict[int, float]] | None = None


@dataclass
class RequestOutput:
    """What `LLM.generate` returns per prompt (and the final state a stream reaches)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = True
    num_cached_tokens: int = 0
    prompt_logprobs: list[dict[int, float] | None] | None = None

    @property
    def token_ids(self) -> list[int]:
        """The first completion's tokens (convenience for n == 1)."""
        return self.outputs[0].token_ids

    @property
    def text(self) -> str:
        return self.outputs[0].text


class TokenView(Sequence[int]):
    """Two token lists read as one (slices copy only what they cover)."""

    __slots__ = ("head", "tail")

    def __init__(self, head: list[int], tail: list[int]):
        self.head, self.tail = head, tail

    def __len__(self) -> int:
        return len(self.head) + len(self.tail)

    def __getitem__(self, i):  # type: ignore[override]
        n = len(self.head)
        if isinstance(i, slice):
            start, stop, step = i.indices(len(self))
            if step != 1:
                return (self.head + self.tail)[i]
            if stop <= n:
                return self.head[start:stop]
            if start >= n:
                return self.tail[start - n:stop - n]
            return self.head[start:] + self.tail[:stop - n]
        if i < 0:
            i += len(self)
        return self.head[i] if i < n else self.tail[i - n]


@dataclass
class StepDelta:
    """One request's progress in one engine step (what a streaming client receives)."""

    request_id: str
    new_token_ids: list[int]
    text: str
    finished: bool
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    new_logprobs: list[dict[int, float]] | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    error: str | None = None
    # engine-timed phases, on the finishing delta (vLLM's request_{queue,prefill,inference}_time_seconds)
    queue_s: float | None = None
    prefill_s: float | None = None
    inference_s: float | None = None
