"""Request bodies of the HTTP API, validated strictly, and what they ask of the engine.

Types are strict (`"1"` is not a number, `1.5` is not an integer); a wrong one is a 400 naming the field.
Top-level fields the API does not define are sorted three ways:
* known OpenAI fields that change nothing here (`user`, `metadata`, `store`, `service_tier`, ...): ignored;
* fields asking for something this server cannot do (`audio`, `modalities` other than text, `prediction`,
  `logit_bias`, ...): 400 `unsupported_parameter`, so a client never believes it got what it asked for;
* anything else: ignored (as vLLM does), so clients that send vendor extras keep working.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from ..engine.protocol import SamplingMsg
from ..engine.sampling_params import SamplingParams, SamplingParamsError, StructuredOutputsParams
from .errors import APIError, from_validation

# Fields that ask for behaviour this server does not have (value that is accepted, if any, after the name).
UNSUPPORTED: dict[str, str] = {
    "audio": "audio output is not supported (DeepSeek-V4 is a text model)",
    "modalities": "only the text modality is supported",
    "prediction": "predicted outputs are not supported",
    "web_search_options": "web search is not supported",
    "functions": "the legacy `functions` field is not supported; send `tools`",
    "function_call": "the legacy `function_call` field is not supported; send `tool_choice`",
    "logit_bias": "logit_bias is not supported",
    "prompt_logprobs": "prompt_logprobs is not supported by the HTTP API",
    "suffix": "suffix (fill-in-the-middle) is not supported",
    "mcp_servers": "MCP servers are not supported",
    "container": "containers are not supported",
}
# Values of an unsupported field that are fine (the default meaning).
_HARMLESS_VALUES: dict[str, tuple[Any, ...]] = {
    "modalities": (None, ["text"]), "logit_bias": (None, {}), "functions": (None, []), "function_call": (None,),
    "suffix": (None, ""), "audio": (None,), "prediction": (None,), "web_search_options": (None,),
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class SamplingExtras(BaseModel):
    """vLLM's sampling extras that `sampling_for` reads, on the routes whose own API lacks them (Anthropic Messages,
    Responses): accepted there with the chat route's meaning."""

    n: int | None = None
    min_p: float | None = None
    seed: int | None = None
    min_tokens: int | None = None
    ignore_eos: bool = False
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    cache_salt: str | None = None


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Sampling(BaseModel):
    """Sampling fields shared by the OpenAI routes (vLLM's extras included)."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    n: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    min_tokens: int | None = None
    ignore_eos: bool = False
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    cache_salt: str | None = None
    # vLLM's structured outputs (server/structured.py)
    structured_outputs: dict[str, Any] | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    def structured_extras(self) -> dict[str, Any]:
        """The structured-output fields given, by name."""
        names = ("structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar")
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and (self.stream_options.include_usage
                                             or self.stream_options.continuous_usage_stats))


class ChatCompletionRequest(_Sampling):
    messages: list[dict[str, Any]]
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    reasoning_effort: str | int | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None
    echo: bool = False
    best_of: int | None = None


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    model: str | None = None
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    add_special_tokens: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: str | int | None = None
    return_token_strs: bool = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    model: str | None = None
    tokens: list[int]


MAX_JSON_DEPTH = 700  # nesting that deep is legal JSON a client may send (tool schemas); beyond it, a 400


def _depth(value: Any, limit: int) -> int:
    """Nesting depth of decoded JSON, iteratively (no recursion), stopping once past `limit`."""
    stack, deepest = [(value, 1)], 0
    while stack:
        v, d = stack.pop()
        deepest = max(deepest, d)
        if deepest > limit:
            break
        if isinstance(v, dict):
            stack += [(x, d + 1) for x in v.values()]
        elif isinstance(v, list):
            stack += [(x, d + 1) for x in v]
    return deepest


def _validate_deep(model: type[BaseModel], body: bytes) -> Any:
    try:
        data = json.loads(body)
    except RecursionError:
        data = None
    except ValueError as err:
        raise APIError(f"the request body is not valid JSON: {err}", code="invalid_json") from None
    if data is None or _depth(data, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        raise APIError(f"the request body nests JSON deeper than {MAX_JSON_DEPTH} levels", code="invalid_json")
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise from_validation(err) from None


def parse_body(model: type[BaseModel], body: bytes) -> Any:
    """Validate a raw JSON body; 400 naming the first field at fault. Unsupported fields are refused."""
    try:
        req = model.model_validate_json(body)
    except ValidationError as err:
        if "recursion limit" not in str(err):
            raise from_validation(err) from None
        req = _validate_deep(model, body)  # pydantic's JSON parser stops at 200 levels; tool schemas go deeper
    for name, value in (req.model_extra or {}).items():
        if name in UNSUPPORTED and value not in _HARMLESS_VALUES.get(name, (None,)):
            raise APIError(f"{name}: {UNSUPPORTED[name]}", param=name, code="unsupported_parameter")
    return req


# ------------------------------------------------------------------------------------------------------------
# sampling
# ------------------------------------------------------------------------------------------------------------
def sampling_for(req: _Sampling, vocab_size: int, *, max_tokens: int | None, logprobs: int | None,
                 max_tokens_param: str = "max_tokens", structured: StructuredOutputsParams | None = None,
                 ) -> SamplingMsg:
    """The engine's sampling message for a request, validated (400 naming the field). `structured`: the checked
    output constraint (server/structured.py)."""
    def given(value: Any, default: Any) -> Any:
        return default if value is None else value

    params = SamplingParams(
        n=given(req.n, 1), max_tokens=max_tokens, min_tokens=given(req.min_tokens, 0),
        temperature=given(req.temperature, 1.0), top_p=given(req.top_p, 1.0), top_k=given(req.top_k, 0),
        min_p=given(req.min_p, 0.0), seed=req.seed, presence_penalty=given(req.presence_penalty, 0.0),
        frequency_penalty=given(req.frequency_penalty, 0.0), repetition_penalty=given(req.repetition_penalty, 1.0),
        stop=req.stop, stop_token_ids=req.stop_token_ids or [], ignore_eos=req.ignore_eos, logprobs=logprobs,
        skip_special_tokens=req.skip_special_tokens, include_stop_str_in_output=req.include_stop_str_in_output,
        structured_outputs=structured)
    # the engine message carries 64-bit integers: a larger one must be the client's 400, not an encoding 500
    for name in ("seed", "top_k", "n", "max_tokens", "min_tokens", "logprobs", "stop_token_ids"):
        value = max_tokens if name == "max_tokens" else logprobs if name == "logprobs" else getattr(req, name, None)
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, int) and not -(2**63) <= v < 2**63:
                param = max_tokens_param if name == "max_tokens" else name
                raise APIError(f"{param}: must be a 64-bit integer, got {v}", param=param, code="invalid_value")
    try:
        params.validate(vocab_size)
    except SamplingParamsError as err:
        param = max_tokens_param if err.field == "max_tokens" else err.field
        reason = str(err).split(": ", 1)[-1]
        raise APIError(f"{param}: {reason}", param=param, code="invalid_value") from None
    return SamplingMsg(**{name: getattr(params, name) for name in SamplingMsg.__struct_fields__})


def check_context(num_prompt: int, max_tokens: int | None, max_model_len: int, *, prompt_param: str,
                  max_tokens_param: str = "max_tokens") -> None:
    """A prompt that fills the context, or max_tokens beyond what is left: 400 with the numbers."""
    if num_prompt >= max_model_len:
        raise APIError(f"the prompt has {num_prompt} tokens but this server's context is {max_model_len} tokens "
                       "(--max-model-len), and a prompt must leave room for at least one output token; "
                       "shorten the prompt", param=prompt_param, code="context_length_exceeded")
    if max_tokens is not None and num_prompt + max_tokens > max_model_len:
        raise APIError(f"{max_tokens_param} ({max_tokens}) plus the prompt ({num_prompt} tokens) exceeds the "
                       f"context of {max_model_len} tokens; lower {max_tokens_param} to at most "
                       f"{max_model_len - num_prompt}", param=max_tokens_param, code="context_length_exceeded")


ThinkingChoice = Literal["auto", "on", "off"]


def resolve_thinking(explicit: Any, effort: Any, default: ThinkingChoice, family: str) -> bool:
    """Thinking mode: an explicit switch wins; else a reasoning effort (other than "none") turns it on;
    else the server default (auto: on for V4.1, off for V4)."""
    if explicit is not None:
        if not isinstance(explicit, bool):
            raise APIError(f"chat_template_kwargs.thinking must be true or false, got {explicit!r}",
                           param="chat_template_kwargs.thinking")
        return explicit
    if effort is not None:
        return effort != "none"
    return default == "on" or (default == "auto" and family == "v41")
