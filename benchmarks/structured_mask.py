"""Per-step cost of enforced structured output at batch 64, on the CPU, with DeepSeek-V4's real tokenizer (129,280 ids).

    .venv/bin/python benchmarks/structured_mask.py [--batch 64] [--threads 2] [--repeats 3] [--out FILE.json]

(the comparison needs `pip install llguidance`, which v4serve itself does not use)

Part 1 compares the grammar libraries on the same work: 64 requests teacher-forced through 64 different JSON documents
that match a schema (and, separately, the "any JSON object" grammar of `json_object`); every step fills the next-token
bitmask of each still-running row and then accepts its token. Serial = one call per row from Python; batched =
the library's own batch call (xgrammar's BatchGrammarMatcher, llguidance's LLExecutor). It also reports whether the
fill releases the GIL (how much a Python thread running beside it slows down), which decides whether it can overlap
the model step.

Part 2 measures v4serve's path with the picked library (engine/guided.py): the fill as the runner runs it, the
one-op apply inside the sampler (`sample` with and without a [64, V/32] bitmask), the accept, and how much of the
fill a concurrent step hides. Part 3 runs the engine (tiny-v4-flash, CPU) at batch 64 with and without a grammar on
every row and reports the decode step time. Numbers go to benchmarks/RESULTS.md ("Structured output mask cost").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from v4serve.tokenizer import default_tokenizer

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string"},
        "role": {"type": "string", "enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
        "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                    "required": ["city", "zip"], "additionalProperties": False},
        "score": {"type": "number"},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "email", "role", "tags", "address", "score", "active"],
    "additionalProperties": False,
}
WORDS = ["alpha", "beta", "gamma", "delta", "paris", "tokyo", "lima", "oslo", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "release", "notes", "serving", "engine", "prefix", "cache", "kernel", "décor", "naïve", "東京", "数据"]


def documents(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """n different documents valid under SCHEMA (also JSON objects for the json_object grammar)."""
    rng = random.Random(seed)

    def words(k: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(k))

    return [{"name": words(rng.randint(1, 4))[:40], "age": rng.randint(0, 150),
             "email": f"{rng.choice(WORDS)}.{i}@example.com", "role": rng.choice(["admin", "user", "guest"]),
             "tags": [words(1) for _ in range(rng.randint(0, 4))],
             "address": {"city": words(rng.randint(1, 2)), "zip": str(rng.randint(10000, 99999))},
             "score": round(rng.uniform(-100, 100), rng.randint(0, 4)), "active": rng.random() < 0.5}
            for i in range(n)]


# ------------------------------------------------------------------------------------------------------------
# library adapters: setup (vocabulary + grammar), new matchers, fill rows, accept tokens
# ------------------------------------------------------------------------------------------------------------
class Xgrammar:
    name = "xgrammar"

    def __init__(self, tok: Any, threads: int) -> None:
        import xgrammar as xgr

        from v4serve.engine.guided import grammar_vocabulary

        self.xgr = xgr
        t0 = time.perf_counter()
        vocab = grammar_vocabulary(tok, "json")
        info = xgr.TokenizerInfo(vocab, xgr.VocabType.RAW, vocab_size=tok.vocab_size, stop_token_ids=[tok.eos_id])
        self.compiler = xgr.GrammarCompiler(info, max_threads=threads, cache_enabled=False)
        self.setup_s = time.perf_counter() - t0
        self.batch = xgr.BatchGrammarMatcher(threads)
        self.version = xgr.__version__ if hasattr(xgr, "__version__") else _dist_version("xgrammar")

    def compile(self, kind: str) -> Any:
        from v4serve.engine.sampling_params import WHITESPACE_LIMIT

        schema = '{"type": "object"}' if kind == "json_object" else json.dumps(SCHEMA)
        return self.compiler.compile_json_schema(schema, any_whitespace=True, max_whitespace_cnt=WHITESPACE_LIMIT,
                                                 strict_mode=kind != "json_object")

    def matchers(self, compiled: Any, n: int) -> list[Any]:
        return [self.xgr.GrammarMatcher(compiled) for _ in range(n)]

    def fill_serial(self, ms: list[Any], rows: list[int], bitmask: torch.Tensor) -> None:
        for i in rows:
            ms[i].fill_next_token_bitmask(bitmask, i)

    def fill_batched(self, ms: list[Any], rows: list[int], bitmask: torch.Tensor) -> None:
        self.batch.batch_fill_next_token_bitmask([ms[i] for i in rows], bitmask, rows)

    def accept_serial(self, ms: list[Any], rows: list[int], tokens: list[int]) -> bool:
        return all(ms[i].accept_token(t) for i, t in zip(rows, tokens))

    def accept_batched(self, ms: list[Any], rows: list[int], tokens: list[int]) -> bool:
        return all(self.xgr.BatchGrammarMatcher.batch_accept_token([ms[i] for i in rows], tokens))


class Llguidance:
    name = "llguidance"

    def __init__(self, tok: Any, threads: int) -> None:
        import llguidance
        import llguidance.torch as llt

        self.llg, self.llt = llguidance, llt
        t0 = time.perf_counter()
        self.tokenizer = llguidance.LLTokenizer(tok.backend.to_str(), n_vocab=tok.vocab_size, eos_token=tok.eos_id)
        self.setup_s = time.perf_counter() - t0
        self.executor = llguidance.LLExecutor(threads)
        self.version = llguidance.__version__

    def compile(self, kind: str) -> Any:
        from v4serve.engine.sampling_params import WHITESPACE_LIMIT

        # the same bounded whitespace as v4serve's xgrammar grammars
        options = {"whitespace_flexible": True, "whitespace_pattern": f"[\\x20\\x0A\\x0D\\x09]{{0,{WHITESPACE_LIMIT}}}"}
        schema = {"type": "object"} if kind == "json_object" else SCHEMA
        return self.llg.LLMatcher.grammar_from_json_schema(schema, defaults=options)  # compiled lazily, per matcher

    def matchers(self, grammar: Any, n: int) -> list[Any]:
        return [self.llg.LLMatcher(self.tokenizer, grammar, log_level=0) for _ in range(n)]

    def fill_serial(self, ms: list[Any], rows: list[int], bitmask: torch.Tensor) -> None:
        for i in rows:
            self.llt.fill_next_token_bitmask(ms[i], bitmask, i)

    def fill_batched(self, ms: list[Any], rows: list[int], bitmask: torch.Tensor) -> None:
        self.llt.fill_next_token_bitmask_par(self.executor, [(ms[i], i) for i in rows], bitmask)

    def accept_serial(self, ms: list[Any], rows: list[int], tokens: list[int]) -> bool:
        return all(ms[i].consume_token(t) for i, t in zip(rows, tokens))

    def accept_batched(self, ms: list[Any], rows: list[int], tokens: list[int]) -> bool:
        return all(self.llt.consume_token_par(self.executor, [(ms[i], t) for i, t in zip(rows, tokens)]))


def _dist_version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


# ------------------------------------------------------------------------------------------------------------
# measurement
# ------------------------------------------------------------------------------------------------------------
def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"mean_ms": 1e3 * statistics.fmean(ordered), "p50_ms": 1e3 * ordered[len(ordered) // 2],
            "p99_ms": 1e3 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], "max_ms": 1e3 * ordered[-1]}


def run_trajectories(lib: Any, kind: str, traj: list[list[int]], mode: str, repeats: int) -> dict[str, Any]:
    """Teacher-force every row through its document; time fill and accept of each step (rows still running)."""
    from v4serve.engine.guided import allocate_bitmask

    fill = lib.fill_batched if mode == "batched" else lib.fill_serial
    accept = lib.accept_batched if mode == "batched" else lib.accept_serial
    t0 = time.perf_counter()
    compiled = lib.compile(kind)
    compile_s = time.perf_counter() - t0
    fills: list[float] = []
    accepts: list[float] = []
    steps = max(len(t) for t in traj)
    for rep in range(repeats + 1):  # the first pass warms caches and is not counted
        ms = lib.matchers(compiled, len(traj))
        bitmask = allocate_bitmask(len(traj), default_tokenizer().vocab_size)
        for s in range(steps):
            rows = [i for i, t in enumerate(traj) if s < len(t)]
            tokens = [traj[i][s] for i in rows]
            t0 = time.perf_counter()
            fill(ms, rows, bitmask)
            t1 = time.perf_counter()
            ok = accept(ms, rows, tokens)
            t2 = time.perf_counter()
            if not ok:
                raise RuntimeError(f"{lib.name} rejected a valid document at step {s} ({kind}, {mode})")
            for i, t in zip(rows, tokens):  # the forced token must have been allowed by the mask
                if not (int(bitmask[i, t // 32]) >> (t % 32)) & 1:
                    raise RuntimeError(f"{lib.name}: token {t} of row {i} masked at step {s}")
            if rep:
                fills.append(t1 - t0)
                accepts.append(t2 - t1)
    return {"compile_ms": 1e3 * compile_s, "steps": steps, "fill": summary(fills), "accept": summary(accepts),
            "step_mean_ms": 1e3 * (statistics.fmean(fills) + statistics.fmean(accepts))}


def gil_slowdown(lib: Any, traj: list[list[int]], mode: str) -> float:
    """Slowdown of a pure-Python loop while a thread keeps filling masks (1.0: the fill released the GIL)."""
    from v4serve.engine.guided import allocate_bitmask

    compiled = lib.compile("schema")
    ms = lib.matchers(compiled, len(traj))
    for i, t in enumerate(traj):  # into the middle of the documents, where masks are not trivial
        for tok in t[: len(t) // 2]:
            lib.accept_serial(ms, [i], [tok])
    rows = list(range(len(traj)))
    bitmask = allocate_bitmask(len(traj), default_tokenizer().vocab_size)
    fill = lib.fill_batched if mode == "batched" else lib.fill_serial

    def py_work() -> float:
        t0 = time.perf_counter()
        s = 0
        for i in range(2_000_000):
            s += i
        return time.perf_counter() - t0

    alone = min(py_work() for _ in range(3))
    stop = threading.Event()

    def filler() -> None:
        while not stop.is_set():
            fill(ms, rows, bitmask)

    th = threading.Thread(target=filler)
    th.start()
    try:
        beside = min(py_work() for _ in range(3))
    finally:
        stop.set()
        th.join()
    return beside / alone


def measure_libraries(args: argparse.Namespace, traj: dict[str, list[list[int]]]) -> dict[str, Any]:
    tok = default_tokenizer()
    out: dict[str, Any] = {}
    for cls in (Xgrammar, Llguidance):
        try:
            lib = cls(tok, args.threads)
        except ImportError as err:  # llguidance is not a dependency: `pip install llguidance` to compare
            out[cls.name] = {"skipped": str(err)}
            continue
        res: dict[str, Any] = {"version": lib.version, "tokenizer_setup_ms": 1e3 * lib.setup_s}
        for kind in ("schema", "json_object"):
            for mode in ("serial", "batched"):
                res[f"{kind}/{mode}"] = run_trajectories(lib, kind, traj[kind], mode, args.repeats)
        for mode in ("serial", "batched"):
            res[f"gil_slowdown/{mode}"] = gil_slowdown(lib, traj["schema"], mode)
        out[lib.name] = res
    return out


# ------------------------------------------------------------------------------------------------------------
# v4serve's own path (engine/guided.py + sampler)
# ------------------------------------------------------------------------------------------------------------
def measure_v4serve(args: argparse.Namespace, traj: list[list[int]]) -> dict[str, Any]:
    from v4serve.engine.guided import GrammarCompilerCache, StructuredOutputsParams
    from v4serve.engine.guided_batch import MaskBuilder
    from v4serve.engine.sampler import SamplingBatch, process_logits, sample
    from v4serve.engine.sampling_params import SamplingParams

    tok = default_tokenizer()
    V = tok.vocab_size
    cache = GrammarCompilerCache(tok, threads=args.threads)
    spec = StructuredOutputsParams(json=json.dumps(SCHEMA))
    t0 = time.perf_counter()
    compiled = cache.compile(spec)  # the first compilation also builds the vocabulary
    first_compile_ms = 1e3 * (time.perf_counter() - t0)
    t0 = time.perf_counter()
    cache.compile(StructuredOutputsParams(json=json.dumps({**SCHEMA, "title": "another"})))
    compile_ms = 1e3 * (time.perf_counter() - t0)
    builder = MaskBuilder(V, threads=args.threads)
    B = len(traj)
    fills, accepts = [], []
    steps = max(len(t) for t in traj)
    bitmask = None
    for rep in range(args.repeats + 1):
        guides = [compiled.matcher() for _ in range(B)]
        for s in range(steps):
            rows = [i for i, t in enumerate(traj) if s < len(t)]
            t0 = time.perf_counter()
            bitmask, _ = builder.submit([guides[i] for i in rows], rows, B).result()
            t1 = time.perf_counter()
            ok = all(guides[i].accept(traj[i][s]) for i in rows)
            t2 = time.perf_counter()
            assert ok
            if rep:
                fills.append(t1 - t0)
                accepts.append(t2 - t1)
            if s == steps // 4:
                mid = bitmask.clone()  # a typical mask (inside the documents) for the apply measurement

    def median_ms(fn: Callable[[], Any], n: int) -> float:
        fn()
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return 1e3 * statistics.median(times)

    logits = torch.randn(B, V)
    greedy = SamplingBatch.build([SamplingParams(temperature=0.0)] * B, vocab_size=V)
    masked = SamplingBatch.build([SamplingParams(temperature=0.0)] * B, vocab_size=V)
    masked.bitmask = mid  # every row constrained: row-aligned, as the runner passes it
    sampled = SamplingBatch.build([SamplingParams(temperature=0.8, seed=i) for i in range(B)], vocab_size=V)
    return {"first_compile_ms": first_compile_ms, "compile_ms": compile_ms, "fill": summary(fills),
            "accept": summary(accepts),
            "process_logits_ms": median_ms(lambda: process_logits(logits, greedy), 20),
            "process_logits_masked_ms": median_ms(lambda: process_logits(logits, masked), 20),
            "sample_greedy_ms": median_ms(lambda: sample(logits, greedy), 5),
            "sample_temperature_ms": median_ms(lambda: sample(logits, sampled), 3)}


def overlap(args: argparse.Namespace, traj: list[list[int]]) -> dict[str, Any]:
    """The runner submits the fill before the model step and waits after it: how much of the fill the step hides.
    The 'model step' here is a fixed amount of torch work (a stand-in for a CPU forward pass)."""
    from v4serve.engine.guided import GrammarCompilerCache, StructuredOutputsParams
    from v4serve.engine.guided_batch import MaskBuilder

    tok = default_tokenizer()
    compiled = GrammarCompilerCache(tok, threads=args.threads).compile(StructuredOutputsParams(json=json.dumps(SCHEMA)))
    builder = MaskBuilder(tok.vocab_size, threads=args.threads)
    a = torch.randn(1024, 1024)

    def model_step() -> None:
        for _ in range(6):
            a @ a

    B = len(traj)
    grammars = [compiled.matcher() for _ in range(B)]
    for i, t in enumerate(traj):
        for x in t[: len(t) // 2]:
            grammars[i].accept(x)
    rows = list(range(B))

    def timed(fn: Callable[[], None], n: int = 20) -> float:
        fn()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) / n

    step = timed(model_step)
    fill = timed(lambda: builder.submit(grammars, rows, B).result())

    def overlapped() -> None:
        job = builder.submit(grammars, rows, B)
        model_step()
        job.result()

    both = timed(overlapped)
    return {"model_step_ms": 1e3 * step, "fill_ms": 1e3 * fill, "step_with_overlapped_fill_ms": 1e3 * both,
            "exposed_ms": 1e3 * (both - step)}


def measure_engine(args: argparse.Namespace) -> dict[str, Any]:
    """Decode step time of the engine (tiny-v4-flash on the CPU, greedy) with `batch` rows, unconstrained vs every
    row under the json_object grammar (its strings never end, so no row finishes early): what the whole structured
    path adds to a step (fill beside the model step, apply, accept). Rounds alternate the two; each round's mean
    over its full decode steps is kept, and the least disturbed (smallest) round is reported."""
    from v4serve.engine.config import EngineConfig
    from v4serve.engine.llm_engine import LLMEngine
    from v4serve.engine.sampling_params import SamplingParams, StructuredOutputsParams

    engine = LLMEngine("tiny-v4-flash", EngineConfig.from_kwargs(device="cpu", max_num_seqs=args.batch,
                                                                 kv_cache_memory=256 << 20, max_model_len=512))
    prompt = engine.tokenizer.encode('Reply with JSON: {"a": "b"}')
    rounds: dict[str, list[float]] = {"plain": [], "json_object": []}
    for r in range(args.engine_rounds + 1):  # round 0 warms up (and compiles the grammar)
        for label, spec in (("plain", None), ("json_object", StructuredOutputsParams(json_object=True))):
            for i in range(args.batch):
                engine.add_request(prompt, SamplingParams(max_tokens=args.engine_tokens, temperature=0.0,
                                                          ignore_eos=True, structured_outputs=spec), f"{label}{r}-{i}")
            times = []
            while engine.has_unfinished():
                running = sum(not q.in_prefill for q in engine.scheduler.running)
                t0 = time.perf_counter()
                deltas = engine.step()
                dt = time.perf_counter() - t0
                if running == args.batch and len(deltas) == args.batch:  # a full decode step
                    times.append(dt)
                for d in deltas:
                    if d.finished:
                        engine.release(d.request_id)
            if r:
                rounds[label].append(1e3 * statistics.fmean(times))
    out: dict[str, Any] = {f"{k}_step_ms": min(v) for k, v in rounds.items()}
    out["rounds_ms"] = rounds
    out["added_ms"] = out["json_object_step_ms"] - out["plain_step_ms"]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--threads", type=int, default=2, help="library worker threads (batched calls, compiler)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--part", choices=("all", "libraries", "v4serve", "engine"), default="all")
    p.add_argument("--engine-tokens", type=int, default=24, help="tokens per request in the engine measurement")
    p.add_argument("--engine-rounds", type=int, default=3)
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args()
    torch.set_num_threads(1)
    tok = default_tokenizer()
    docs = documents(args.batch)
    traj = {"schema": [tok.encode(json.dumps(d, ensure_ascii=False)) + [tok.eos_id] for d in docs],
            "json_object": [tok.encode(json.dumps(d, ensure_ascii=False)) + [tok.eos_id] for d in docs]}
    result: dict[str, Any] = {
        "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "python": platform.python_version(),
        "torch": torch.__version__, "batch": args.batch, "threads": args.threads, "vocab": tok.vocab_size,
        "tokens_per_doc_mean": statistics.fmean(len(t) for t in traj["schema"]), "date": time.strftime("%Y-%m-%d")}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            result["cpu"] = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    if args.part in ("all", "libraries"):
        result["libraries"] = measure_libraries(args, traj)
    if args.part in ("all", "v4serve"):
        result["v4serve"] = measure_v4serve(args, traj["schema"])
        result["overlap"] = overlap(args, traj["schema"])
    if args.part in ("all", "engine"):
        result["engine"] = measure_engine(args)
    text = json.dumps(result, indent=2, ensure_ascii=False)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
