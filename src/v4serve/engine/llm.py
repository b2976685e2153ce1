"""The offline API: `LLM(model).generate(prompts, SamplingParams(...))`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..presets import DEMO_PRESET
from .config import EngineConfig
from .llm_engine import LLMEngine
from .request import CompletionOutput, RequestOutput
from .sampling_params import SamplingParams

Prompt = str | list[int]


class LLM:
    """A model served in-process. `model` is a preset name or a checkpoint folder; a preset gets deterministic
    random weights from `seed`, so two instances of a preset are the same model. Every engine option is a keyword
    (e.g. `LLM(model, enable_prefix_caching=False, max_num_seqs=64)`)."""

    def __init__(self, model: str = DEMO_PRESET, *, seed: int = 0, numerics: str = "deepseek", **engine_kwargs: Any):
        self.engine = LLMEngine(model, EngineConfig.from_kwargs(seed=seed, numerics=numerics, **engine_kwargs))
        self.tokenizer = self.engine.tokenizer
        self.config = self.engine.model_config

    def close(self) -> None:
        """Release what the engine started (tensor-parallel worker processes)."""
        self.engine.close()

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = False, cache_salt: str | None = None) -> list[RequestOutput]:
        """One output per prompt, in order. Prompts are strings (tokenized as they are, no chat template) or token-id
        lists."""
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        prompts = list(prompts)  # type: ignore[arg-type]
        if sampling_params is None:
            sampling_params = SamplingParams()
        params = list(sampling_params) if isinstance(sampling_params, Sequence) else [sampling_params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} sampling params for {len(prompts)} prompts")
        texts: list[str | None] = []
        token_lists: list[list[int]] = []
        for p in prompts:
            if isinstance(p, str):
                texts.append(p)
                token_lists.append(self.tokenizer.encode(p))
            else:
                texts.append(None)
                token_lists.append(list(p))
        order: list[list[str]] = []
        for toks, sp in zip(token_lists, params):
            order.append(self.engine.add_request(toks, sp, cache_salt=cache_salt))
        bar = None
        if use_tqdm:
            from tqdm import tqdm

            bar = tqdm(total=sum(len(ids) for ids in order), desc="generate")
        while self.engine.has_unfinished():
            for d in self.engine.step():
                if d.finished and bar is not None:
                    bar.update(1)
        if bar is not None:
            bar.close()
        return [self._collect(ids, text, toks) for ids, text, toks in zip(order, texts, token_lists)]

    def _collect(self, ids: list[str], prompt: str | None, toks: list[int]) -> RequestOutput:
        outs = []
        cached = 0
        plp = None
        for i, rid in enumerate(ids):
            req = self.engine.release(rid)
            assert req is not None
            if req.error:
                raise RuntimeError(f"request {rid} failed: {req.error}")
            text = self.tokenizer.decode(req.output_token_ids, req.params.skip_special_tokens)
            outs.append(CompletionOutput(i, _final_text(req, text), list(req.output_token_ids),
                                         req.finish_reason.value if req.finish_reason else None, req.stop_reason,
                                         req.logprobs if req.params.logprobs is not None else None))
            cached = max(cached, req.num_cached_tokens)
            if req.params.prompt_logprobs is not None:
                plp = req.prompt_logprobs
        return RequestOutput(ids[0].split("#")[0], prompt, toks, outs, True, cached, plp)

    def chat(self, messages: list[dict] | list[list[dict]], sampling_params: SamplingParams | None = None,
             tools: list[dict] | None = None, thinking: bool = False, reasoning_effort: str | None = None,
             ) -> RequestOutput | list[RequestOutput]:
        """Chat with DeepSeek-V4's encoding (the reply's reasoning and tool calls stay in the raw text; the server
        parses them)."""
        from ..server.chat import encode_chat

        batch = bool(messages) and isinstance(messages[0], list)
        convs = messages if batch else [messages]
        prompts = [encode_chat(c, tools=tools, thinking=thinking, reasoning_effort=reasoning_effort) for c in convs]
        outs = self.generate(prompts, sampling_params)
        return outs if batch else outs[0]


def _final_text(req, decoded: str) -> str:
    """Apply the stop-string cut to the full decode (the streaming path cut it incrementally)."""
    if isinstance(req.stop_reason, str) and not req.params.include_stop_str_in_output:
        i = decoded.find(req.stop_reason)
        if i >= 0:
            return decoded[:i]
    if isinstance(req.stop_reason, str) and req.params.include_stop_str_in_output:
        i = decoded.find(req.stop_reason)
        if i >= 0:
            return decoded[: i + len(req.stop_reason)]
    return decoded
