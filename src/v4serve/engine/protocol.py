"""Typed messages between the API server process and the engine process (msgpack via msgspec; no pickle)."""

from __future__ import annotations

from typing import Any

import msgspec

from .sampling_params import StructuredOutputsParams


class SamplingMsg(msgspec.Struct, omit_defaults=True):
    n: int = 1
    max_tokens: int | None = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: list[str] = []
    stop_token_ids: list[int] = []
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    structured_outputs: StructuredOutputsParams | None = None  # a frozen dataclass: msgspec encodes it as a map


class AddRequest(msgspec.Struct, tag="add"):
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingMsg
    cache_salt: str | None = None


class Abort(msgspec.Struct, tag="abort"):
    request_ids: list[str]


class GetStats(msgspec.Struct, tag="stats?"):
    token: int = 0


class Shutdown(msgspec.Struct, tag="shutdown"):
    pass


class Delta(msgspec.Struct, omit_defaults=True):
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
    queue_s: float | None = None
    prefill_s: float | None = None
    inference_s: float | None = None


class Deltas(msgspec.Struct, tag="deltas"):
    items: list[Delta]
    step_time: float = 0.0
    scheduled_tokens: int = 0


class Rejected(msgspec.Struct, tag="rejected"):
    request_id: str
    message: str
    status: int = 400


class Stats(msgspec.Struct, tag="stats"):
    token: int
    payload: dict[str, Any]


class Ready(msgspec.Struct, tag="ready"):
    model: str
    family: str
    max_model_len: int
    vocab_size: int
    eos_token_id: int
    capacity: str
    checkpoint_folder: str | None = None


class Fatal(msgspec.Struct, tag="fatal"):
    message: str


ToEngine = AddRequest | Abort | GetStats | Shutdown
FromEngine = Deltas | Rejected | Stats | Ready | Fatal

_enc = msgspec.msgpack.Encoder()
_dec_to_engine = msgspec.msgpack.Decoder(ToEngine)
_dec_from_engine = msgspec.msgpack.Decoder(FromEngine)


def encode(msg: msgspec.Struct) -> bytes:
    return _enc.encode(msg)


def decode_to_engine(b: bytes) -> ToEngine:
    return _dec_to_engine.decode(b)


def decode_from_engine(b: bytes) -> FromEngine:
    return _dec_from_engine.decode(b)
