"""Per-request sampling parameters, with vLLM's names, defaults and meanings.

`validate` is called by the server before a request is admitted, so a bad value becomes a 400
naming the field instead of a failure deep in the batched sampler.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

MAX_LOGPROBS = 20  # OpenAI's limit on top_logprobs
# structured outputs: most whitespace characters in a row between two JSON (or DSML) elements (a newline and
# indentation); bounded so that an output can never run away in whitespace
WHITESPACE_LIMIT = 16
GREEDY_TEMPERATURE = 1e-5  # below this a temperature is treated as 0 (greedy), as vLLM does


@dataclass(frozen=True)
class StructuredOutputsParams:
    """Enforced structured output (vLLM's name and fields): exactly one of
    json (a JSON schema, as JSON text), json_object (any JSON object), regex, choice (one of these strings),
    grammar (EBNF, or Lark) or structural_tag (xgrammar's structural tag, as JSON text; the server uses it for
    DeepSeek-V4's DSML tool calls). Hashable: compiled grammars are cached by it (engine/guided.py)."""

    json: str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None
    structural_tag: str | None = None

    def kind(self) -> str:
        """The one constraint given; SamplingParamsError naming the field otherwise."""
        given = [name for name in ("json", "regex", "choice", "grammar", "structural_tag")
                 if getattr(self, name) is not None] + (["json_object"] if self.json_object else [])
        if len(given) != 1:
            found = ", ".join(given) or "none"
            raise SamplingParamsError("structured_outputs", f"give exactly one of json, json_object, regex, choice, "
                                      f"grammar and structural_tag (found: {found})")
        name = given[0]
        value = getattr(self, name)
        if name == "choice":
            if not value or not all(isinstance(c, str) for c in value):
                raise SamplingParamsError("structured_outputs.choice", "must be a non-empty list of strings")
        elif name != "json_object" and (not isinstance(value, str) or not value):
            raise SamplingParamsError(f"structured_outputs.{name}", "must be a non-empty string")
        return name


class SamplingParamsError(ValueError):
    """An invalid sampling parameter; `field` names it and the message gives the allowed range."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


@dataclass
class SamplingParams:
    """How to sample one request's output.

    n: completions per prompt.  max_tokens: output token budget (None = up to the context window).
    min_tokens: EOS and stop_token_ids are suppressed until this many tokens are generated.
    temperature: 0 means greedy.  top_k: 0 or -1 disable it.  top_p in (0, 1].  min_p in [0, 1]:
    drop tokens whose probability is below min_p times the most likely token's.
    seed: makes the request's tokens reproducible whatever batch it runs in.
    presence/frequency penalties (in [-2, 2]) act on generated tokens; repetition_penalty (> 0,
    1 = off) on prompt and generated tokens.  stop: strings that end the output (excluded from it
    unless include_stop_str_in_output).  stop_token_ids: extra ids that end it like EOS.
    ignore_eos: keep generating past EOS.  logprobs / prompt_logprobs: how many top alternatives
    to return per token (0 = just the chosen one, None = none), at most 20.
    structured_outputs: a grammar the output must follow (engine/guided.py); it starts after the reasoning when
    the prompt leaves a `<think>` open, and the request stops when the grammar is complete.
    """

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
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    structured_outputs: StructuredOutputsParams | None = None

    def __post_init__(self) -> None:
        # accept the OpenAI shapes: a single stop string, None for "no stop strings"
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        else:
            self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids or [])
        so = self.structured_outputs
        if so is not None and isinstance(so.choice, list):  # a list from JSON: the frozen spec keeps a tuple
            self.structured_outputs = replace(so, choice=tuple(so.choice))

    # --- derived facts used by the engine ---------------------------------------------------------
    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE

    @property
    def effective_top_k(self) -> int:
        """top_k with "off" spelled 0."""
        return 0 if self.top_k in (0, -1) else self.top_k

    @property
    def uses_penalties(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    @property
    def uses_truncation(self) -> bool:
        return self.effective_top_k > 0 or self.top_p < 1.0 or self.min_p > 0.0

    def stop_ids(self, eos_id: int | None) -> set[int]:
        """Token ids that end the output: stop_token_ids, plus EOS unless ignore_eos."""
        ids = set(self.stop_token_ids)
        if eos_id is not None and not self.ignore_eos:
            ids.add(eos_id)
        return ids

    def clone(self, **changes: Any) -> SamplingParams:
        return replace(self, stop=list(self.stop), stop_token_ids=list(self.stop_token_ids), **changes)

    # --- validation ------------------------------------------------------------------------------
    def validate(self, vocab_size: int) -> None:
        """Raise SamplingParamsError naming the first bad field and its allowed range."""
        _int_at_least("n", self.n, 1)
        if self.max_tokens is not None:
            _int_at_least("max_tokens", self.max_tokens, 1)
        _int_at_least("min_tokens", self.min_tokens, 0)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise SamplingParamsError(
                "min_tokens", f"must be <= max_tokens ({self.max_tokens}), got {self.min_tokens}"
            )
        _real_in("temperature", self.temperature, 0.0, math.inf, "must be >= 0")
        _real_in("top_p", self.top_p, 0.0, 1.0, "must be in (0, 1]", low_open=True)
        if not _is_int(self.top_k) or (self.top_k < 1 and self.top_k not in (0, -1)):
            raise SamplingParamsError("top_k", f"must be 0 or -1 (disabled) or >= 1, got {self.top_k!r}")
        _real_in("min_p", self.min_p, 0.0, 1.0, "must be in [0, 1]")
        _real_in("presence_penalty", self.presence_penalty, -2.0, 2.0, "must be in [-2, 2]")
        _real_in("frequency_penalty", self.frequency_penalty, -2.0, 2.0, "must be in [-2, 2]")
        _real_in("repetition_penalty", self.repetition_penalty, 0.0, math.inf, "must be > 0", low_open=True)
        if self.seed is not None and not _is_int(self.seed):
            raise SamplingParamsError("seed", f"must be an integer or null, got {self.seed!r}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or not 0 <= value <= MAX_LOGPROBS):
                raise SamplingParamsError(name, f"must be in [0, {MAX_LOGPROBS}] or null, got {value!r}")
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise SamplingParamsError("stop", f"must be non-empty strings, got {s!r}")
        for t in self.stop_token_ids:
            if not _is_int(t) or not 0 <= t < vocab_size:
                raise SamplingParamsError(
                    "stop_token_ids", f"must be token ids in [0, {vocab_size}), got {t!r}"
                )
        if self.structured_outputs is not None:
            self.structured_outputs.kind()


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_at_least(name: str, value: Any, low: int) -> None:
    if not _is_int(value) or value < low:
        raise SamplingParamsError(name, f"must be an integer >= {low}, got {value!r}")


def _real_in(name: str, value: Any, low: float, high: float, rule: str, low_open: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
    ok = ok and (value > low if low_open else value >= low) and value <= high
    if not ok or (high == math.inf and math.isinf(value)):
        raise SamplingParamsError(name, f"{rule}, got {value!r}")
