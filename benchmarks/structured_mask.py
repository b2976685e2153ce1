"""Per-step cost of enforced structured output at batch 64, on the CPU, with DeepSeek-V4's real tokenizer (129,280 ids).

    .venv/bin/python benchmarks/structured_mask.py [--batch 64] [--threads 2] [--repeats 3] [--out FILE.json]

Part 1 compares the grammar libraries on the same work: 64 requests teacher-forced through 64 different JSON documents
that match a schema (and, separately, the "any JSON object" grammar of `json_object`); every step fills the next-token
bitmask of each still-running row and then accepts its token. Serial = one call per row from Python; batched =
the library's own batch call (xgrammar's BatchGrammarMatcher, llguidance's LLExecutor). It also reports whether the
fill releases the GIL (how much a Python thread running beside it slows down), which decides whether it can overlap
the model step.

Part 2 measures v4serve's path with the picked library (engine/guided.py): the fill as the runner runs it, the
transfer and one-op apply inside the sampler (`sample` with and without a [64, V/32] bitmask), and the accept.
Numbers go to benchmarks/RESULTS.md ("Structured output mask cost").
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

from v4serve.tokenizer import default_tokenizer  # noqa: E402

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
WORDS = ("alpha beta gamma delta paris tokyo lima oslo quick brown fox jumps over the lazy dog release notes "
         "serving engine prefix cache kernel décor naïve 東京 数据").split()


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
        vocab = grammar_vocabulary(tok)
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
        lib = cls(tok, args.threads)
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
    from v4serve.engine.sampler import SamplingBatch, sample
    from v4serve.engine.sampling_params import SamplingParams

    tok = default_tokenizer()
    V = tok.vocab_size
    cache = GrammarCompilerCache(tok, threads=args.threads)
    spec = StructuredOutputsParams(json=json.dumps(SCHEMA))
    t0 = time.perf_counter()
    compiled = cache.compile(spec)
    first_compile_ms = 1e3 * (time.perf_counter() - t0)
    t0 = time.perf_counter()
    cache.compile(spec)
    cached_compile_ms = 1e3 * (time.perf_counter() - t0)
    builder = MaskBuilder(V, threads=args.threads)
    B = len(traj)
    params = [SamplingParams(temperature=0.8, top_p=0.95, seed=i) for i in range(B)]
    logits = torch.randn(B, V)
    fills, accepts, plain, masked = [], [], [], []
    steps = max(len(t) for t in traj)
    for rep in range(args.repeats + 1):
        grammars = [compiled.matcher() for _ in range(B)]
        for s in range(steps):
            rows = [i for i, t in enumerate(traj) if s < len(t)]
            t0 = time.perf_counter()
            job = builder.submit([grammars[i] for i in rows], rows, B)
            bitmask, mask_rows = job.result()
            t1 = time.perf_counter()
            batch = SamplingBatch.build(params, vocab_size=V, steps=[s] * B)
            t2 = time.perf_counter()
            sample(logits, batch)
            t3 = time.perf_counter()
            batch.bitmask, batch.bitmask_rows = bitmask, mask_rows
            sample(logits, batch)
            t4 = time.perf_counter()
            ok = all(grammars[i].accept(traj[i][s]) for i in rows)
            t5 = time.perf_counter()
            assert ok
            if rep:
                fills.append(t1 - t0)
                plain.append(t3 - t2)
                masked.append(t4 - t3)
                accepts.append(t5 - t4)
    return {"first_compile_ms": first_compile_ms, "cached_compile_ms": cached_compile_ms, "fill": summary(fills),
            "accept": summary(accepts), "sample_plain": summary(plain), "sample_masked": summary(masked),
            "apply_mean_ms": 1e3 * (statistics.fmean(masked) - statistics.fmean(plain))}


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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--threads", type=int, default=2, help="library worker threads (batched calls, compiler)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--part", choices=("all", "libraries", "v4serve"), default="all")
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
    text = json.dumps(result, indent=2, ensure_ascii=False)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
