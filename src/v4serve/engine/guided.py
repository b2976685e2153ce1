"""Enforced structured output: a request's grammar, compiled once per spec, and its per-request matcher.

Library: xgrammar (benchmarks/structured_mask.py, numbers in benchmarks/RESULTS.md "Structured output mask cost").
Once a grammar is compiled its masks are the cheapest per step on our 129K vocabulary, with a short tail (llguidance
computes masks lazily: slow early steps); its batch call fits the batched sampler; and it knows DeepSeek-V4's DSML
parameter syntax (the "deepseek_xml" JSON-schema style of its structural tags), which the server uses to constrain
`tool_choice` "required" / named.

* `grammar_for(spec)`: the spec as an xgrammar `Grammar`, without a tokenizer. The server calls it (in a worker
  thread) before admitting a request, so a bad schema, regex or grammar is a 400 naming the field (`GrammarError`).
* `GrammarCompilerCache`: the tokenizer's vocabulary as xgrammar sees it and compiled grammars in an LRU keyed by the
  spec (the engine calls it from a worker thread: engine/guided_admission.py).
* `Guide`: one request's matcher. When the prompt leaves a `<think>` open, the guide waits for the model's
  `</think>` before it constrains anything (the reasoning stays free text).

JSON grammars allow whitespace between elements but at most WHITESPACE_LIMIT characters in a row, so an output
can never run away in whitespace; `json` follows the schema strictly (no properties it does not name, as vLLM);
`json_object` is any JSON object.
"""

from __future__ import annotations

import functools
import json
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import xgrammar as xgr

from .sampling_params import WHITESPACE_LIMIT, SamplingParamsError, StructuredOutputsParams

if TYPE_CHECKING:
    from ..tokenizer import Tokenizer

CACHE_SIZE = 256  # compiled grammars kept per engine
DSML_TOKEN = "｜DSML｜"  # the one control token DSML markup is made of (server/tool_calls.py)
_LIB_PREFIX = re.compile(r"^\[[^\]]*\]\s*\S+:\d+:\s*")  # "[12:00:00] /project/cpp/x.cc:42: " on xgrammar errors


class GrammarError(SamplingParamsError):
    """A structured-output spec the grammar library refuses; `field` names the request field."""


def _message(err: Exception) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    text = _LIB_PREFIX.sub("", text)
    return text.replace("Check failed: (error.empty()) is false: ", "")


def choice_ebnf(choices: Sequence[str]) -> str:
    """`root ::= "a" | "b"`: JSON string escaping is what xgrammar's EBNF literals read."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


@functools.lru_cache(maxsize=CACHE_SIZE)
def grammar_for(spec: StructuredOutputsParams) -> xgr.Grammar:
    """The spec as a tokenizer-independent grammar; GrammarError (naming the field) when it cannot be one."""
    kind = spec.kind()
    field = f"structured_outputs.{kind}"
    try:
        if kind == "json":
            return xgr.Grammar.from_json_schema(spec.json or "", any_whitespace=True,
                                                max_whitespace_cnt=WHITESPACE_LIMIT, strict_mode=True)
        if kind == "json_object":
            return xgr.Grammar.from_json_schema('{"type": "object"}', any_whitespace=True,
                                                max_whitespace_cnt=WHITESPACE_LIMIT, strict_mode=False)
        if kind == "regex":
            return xgr.Grammar.from_regex(spec.regex or "")
        if kind == "choice":
            return xgr.Grammar.from_ebnf(choice_ebnf(spec.choice or ()))
        if kind == "grammar":
            return _ebnf_or_lark(spec.grammar or "")
        return xgr.Grammar.from_structural_tag(spec.structural_tag or "")
    except GrammarError:
        raise
    except Exception as err:  # noqa: BLE001 - the library raises RuntimeError / ValueError / its own types
        raise GrammarError(field, _message(err)) from None


def _ebnf_or_lark(text: str) -> xgr.Grammar:
    """EBNF (xgrammar's GBNF dialect, vLLM's default); a grammar that is not EBNF but parses as Lark is taken as
    Lark. The EBNF error is the one reported."""
    try:
        return xgr.Grammar.from_ebnf(text)
    except Exception as ebnf_err:  # noqa: BLE001
        try:
            return xgr.Grammar.from_lark(text)
        except Exception:  # noqa: BLE001
            raise GrammarError("structured_outputs.grammar", _message(ebnf_err)) from None


def check(spec: StructuredOutputsParams) -> None:
    """Raise GrammarError when the spec cannot be compiled (cached: repeated schemas cost nothing)."""
    grammar_for(spec)


def vocabulary_kind(spec: StructuredOutputsParams) -> str:
    """Which vocabulary a spec compiles against (see grammar_vocabulary)."""
    if spec.structural_tag is not None:
        return "markup"
    return "json" if spec.json is not None or spec.json_object else "text"


# ------------------------------------------------------------------------------------------------------------
# vocabulary and compilation
# ------------------------------------------------------------------------------------------------------------
_JSON_FORBIDDEN = frozenset(range(0x20)) - {0x0A, 0x0D}  # raw control bytes; JSON whitespace keeps \n and \r


def grammar_vocabulary(tok: Tokenizer, kind: str = "text", vocab_size: int | None = None) -> list[bytes]:
    """Each token's bytes as the grammar matches them; an empty entry is a token the grammar never allows.

    Always empty: the control tokens (chat roles, `<think>`, BOS/EOS, DSML; EOS stays the stop token), so no grammar
    text can be spelled with them, and ids past the tokenizer's (a model's padded vocabulary).
    kind "json": also every token with a raw control byte other than newline and CR. JSON never has one inside a
    string, but xgrammar lets length-bounded strings (minLength / maxLength) take them (it excludes only quote,
    backslash, CR and LF there); a tab is lost as whitespace, which a JSON output does not need.
    kind "markup" (structural tags): the DSML token keeps its text, so DSML tags are written with the token the model
    was trained on."""
    added = set(tok._added_content)
    keep = tok.token_to_id(DSML_TOKEN) if kind == "markup" else None
    vocab = [b"" if (i in added and i != keep) else tok.token_bytes(i) for i in range(tok.vocab_size)]
    if kind == "json":
        vocab = [b"" if _JSON_FORBIDDEN.intersection(v) else v for v in vocab]
    return vocab + [b""] * max(0, (vocab_size or 0) - len(vocab))


def allocate_bitmask(rows: int, vocab_size: int) -> torch.Tensor:
    """[rows, ceil(V / 32)] int32, every token allowed; bit j of word w is token 32 w + j."""
    return xgr.allocate_token_bitmask(rows, vocab_size)


class CompiledGuide:
    """A grammar compiled for the tokenizer; `matcher()` starts one request's state."""

    def __init__(self, compiled: xgr.CompiledGrammar, think_end_id: int) -> None:
        self.compiled, self.think_end_id = compiled, think_end_id

    def matcher(self, wait_for_reasoning: bool = False) -> Guide:
        return Guide(xgr.GrammarMatcher(self.compiled), self.think_end_id, wait_for_reasoning)


class GrammarCompilerCache:
    """Compiles specs for one tokenizer, keeping the last CACHE_SIZE results (thread-safe; equal specs compile once
    unless evicted). The vocabulary is built on first use (~1-2 s for 129K tokens)."""

    def __init__(self, tok: Tokenizer, threads: int = 1, size: int = CACHE_SIZE, vocab_size: int | None = None,
                 ) -> None:
        self.tok, self.threads, self.size = tok, threads, size
        self.vocab_size = max(vocab_size or 0, tok.vocab_size)  # the model's (logits') width
        self._compilers: dict[str, xgr.GrammarCompiler] = {}
        self._cache: OrderedDict[StructuredOutputsParams, CompiledGuide] = OrderedDict()
        self._lock = threading.Lock()

    def _compiler(self, kind: str) -> xgr.GrammarCompiler:
        with self._lock:
            compiler = self._compilers.get(kind)
            if compiler is None:
                info = xgr.TokenizerInfo(grammar_vocabulary(self.tok, kind, self.vocab_size), xgr.VocabType.RAW,
                                         vocab_size=self.vocab_size, stop_token_ids=[self.tok.eos_id])
                compiler = self._compilers[kind] = xgr.GrammarCompiler(info, max_threads=self.threads,
                                                                      cache_enabled=False)
            return compiler

    def compile(self, spec: StructuredOutputsParams) -> CompiledGuide:
        """The compiled grammar of a spec; GrammarError for one that cannot be compiled."""
        with self._lock:
            hit = self._cache.get(spec)
            if hit is not None:
                self._cache.move_to_end(spec)
                return hit
        grammar = grammar_for(spec)
        try:
            compiled = self._compiler(vocabulary_kind(spec)).compile_grammar(grammar)
        except Exception as err:  # noqa: BLE001 - reported on the request, never fatal to the engine
            raise GrammarError("structured_outputs", _message(err)) from None
        guide = CompiledGuide(compiled, self.tok.think_end_id)
        with self._lock:
            self._cache[spec] = guide
            while len(self._cache) > self.size:
                self._cache.popitem(last=False)
        return guide


# ------------------------------------------------------------------------------------------------------------
# one request
# ------------------------------------------------------------------------------------------------------------
class Guide:
    """One request's grammar state. Inactive while waiting for the end of the reasoning (`</think>`); then every
    sampled token must be accepted by the matcher, which ends in the stop token (EOS)."""

    def __init__(self, matcher: xgr.GrammarMatcher, think_end_id: int, wait_for_reasoning: bool) -> None:
        self.matcher = matcher
        self.think_end_id = think_end_id
        self.waiting = wait_for_reasoning

    @property
    def active(self) -> bool:
        """Whether the next token is constrained."""
        return not self.waiting and not self.matcher.is_terminated()

    @property
    def terminated(self) -> bool:
        return self.matcher.is_terminated()

    def accept(self, token_id: int) -> bool:
        """Advance with a sampled token; False when the grammar does not allow it."""
        if self.waiting:
            self.waiting = token_id != self.think_end_id
            return True
        return bool(self.matcher.accept_token(token_id))

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        self.matcher.fill_next_token_bitmask(bitmask, row)
