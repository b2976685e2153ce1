"""Step profile by op family: GPU time, kernel launches and the floor of each family, for decode steps and one
prefill chunk.

    python benchmarks/profile_step.py v4-flash-e16 --batch 1 --context 2048 [--steps 5] [--prefill 8192] [--out DIR]

The model code carries one `record_function` range per family (ops/profiling.py: linear, moe, router, attention,
indexer, compressor, mhc, norm/rope/quant, sampling; everything else is `other`); a kernel belongs to the innermost
range open when it was launched. Ranges exist only in eager execution, so the profiled steps run eagerly
(`--enforce-eager`), without PDL unless V4SERVE_PDL is set (a kernel launched early waits on the GPU inside its own
span); the CUDA-graph step time is measured beside them without the profiler. Floors come from
benchmarks/floors.py with the HBM and FP8/bf16 ceilings measured in the same run.

A/B of switches read at run time, in one process (`--graph-only`): each `--env-variant "V4SERVE_OVERLAP=... [...]"`
recaptures the decode graph under that environment and times it, interleaved with the starting one over `--rounds`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict

import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

import floors  # noqa: E402
import replay_trace  # noqa: E402
from decoding import prompt_steps, start_decoding  # noqa: E402

from v4serve.engine.config import EngineConfig  # noqa: E402
from v4serve.engine.llm_engine import LLMEngine  # noqa: E402
from v4serve.engine.sampling_params import SamplingParams  # noqa: E402
from v4serve.models.footprint import checkpoint_bytes, held_bytes  # noqa: E402
from v4serve.ops import profiling  # noqa: E402

PREFIX = "v4serve."


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _innermost(ranges: list[tuple[int, int, str]], t: int) -> str:
    best, best_start = "other", -1
    for s, e, name in ranges:
        if s <= t <= e and s > best_start:
            best, best_start = name, s
    return best


def attribute_cuda(prof, kernels: dict | None = None) -> dict[str, dict[str, float]]:
    """Per family on a GPU, from the raw kineto events: each device activity (kernel, memcpy, memset) is matched by its
    CUPTI correlation id to the runtime/driver call that launched it, and that call's time to the innermost family
    range open on its thread. This covers Triton kernels (launched by the driver API, outside any aten op) as well
    as torch ops. `kernels`, when given, also collects (family, kernel name) -> {"ms", "launches"}."""
    events = prof.profiler.kineto_results.events()
    ranges: dict[int, list[tuple[int, int, str]]] = defaultdict(list)
    launches: dict[int, tuple[int, int]] = {}
    device = []
    for e in events:
        kind = e.activity_type() if hasattr(e, "activity_type") else ""
        name = e.name()
        if e.device_type() == torch.autograd.DeviceType.CPU:
            if name.startswith(PREFIX) and e.is_user_annotation():
                ranges[e.start_thread_id()].append((e.start_ns(), e.end_ns(), name[len(PREFIX):]))
            elif kind in ("cuda_runtime", "cuda_driver") or "Launch" in name or "Memcpy" in name or "Memset" in name:
                launches[e.correlation_id()] = (e.start_thread_id(), e.start_ns())
        elif not name.startswith(PREFIX) and "annotation" not in kind:
            device.append(e)
    out: dict[str, dict[str, float]] = defaultdict(lambda: {"ms": 0.0, "launches": 0})
    for e in device:
        where = launches.get(e.correlation_id())
        name = _innermost(ranges.get(where[0], []), where[1]) if where else "other"
        fam = out[name]
        fam["ms"] += e.duration_ns() / 1e6
        fam["launches"] += 1
        if kernels is not None:
            k = kernels.setdefault((name, e.name()[:90]), {"ms": 0.0, "launches": 0})
            k["ms"] += e.duration_ns() / 1e6
            k["launches"] += 1
    return dict(out)


def top_kernels(kernels: dict, n_steps: int, top: int) -> tuple[list[str], list[dict]]:
    """The `top` kernels by GPU time per step, with their family and launches per step."""
    ranked = sorted(kernels.items(), key=lambda kv: -kv[1]["ms"])[:top]
    rows = [{"family": f, "kernel": k, "us": v["ms"] / n_steps * 1e3, "launches": v["launches"] / n_steps}
            for (f, k), v in ranked]
    lines = ["\n| family | kernel | GPU us/step | launches/step | us/launch |", "|---|---|---|---|---|"]
    lines += [f"| {r['family']} | `{r['kernel']}` | {r['us']:.1f} | {r['launches']:.0f} | "
              f"{r['us'] / max(r['launches'], 1):.2f} |" for r in rows]
    return lines, rows


def attribute_cpu(prof) -> dict[str, dict[str, float]]:
    """Per family on a CPU dry run: the self time of leaf ops under each range."""
    events = prof.events()
    ranges: dict[int, list[tuple[float, float, str]]] = defaultdict(list)
    for e in events:
        if e.name.startswith(PREFIX):
            ranges[e.thread].append((e.time_range.start, e.time_range.end, e.name[len(PREFIX):]))
    out: dict[str, dict[str, float]] = defaultdict(lambda: {"ms": 0.0, "launches": 0})
    for e in events:
        if e.name.startswith(PREFIX) or e.cpu_children:
            continue
        fam = out[_innermost(ranges.get(e.thread, []), e.time_range.start)]
        fam["ms"] += e.self_cpu_time_total / 1e3
        fam["launches"] += 1
    return dict(out)


def attribute(prof, cuda: bool, kernels: dict | None = None) -> dict[str, dict[str, float]]:
    """Per family: device time (ms) and launches on a GPU; CPU self time and ops on a CPU dry run."""
    return attribute_cuda(prof, kernels) if cuda else attribute_cpu(prof)


def table(title: str, fams: dict[str, dict[str, float]], floor: dict[str, float], n: int) -> list[str]:
    lines = [f"\n{title}", "| family | GPU ms | launches | floor ms | x floor |", "|---|---|---|---|---|"]
    total_ms = sum(v["ms"] for v in fams.values()) / n
    total_l = sum(v["launches"] for v in fams.values()) / n
    for name in profiling.FAMILIES:
        v = fams.get(name, {"ms": 0.0, "launches": 0})
        fl = floor.get(name, 0.0)
        x = f"{v['ms'] / n / fl:.1f}" if fl > 1e-6 and v["ms"] else "-"
        lines.append(f"| {name} | {v['ms'] / n:.3f} | {v['launches'] / n:.0f} | {fl:.3f} | {x} |")
    fl_total = sum(floor.values())
    lines.append(f"| **total** | {total_ms:.3f} | {total_l:.0f} | {fl_total:.3f} | "
                 f"{total_ms / fl_total if fl_total else 0:.1f} |")
    return lines


def replay_ms(eng: LLMEngine, batch: int, n: int = 20) -> float:
    """GPU time of the captured decode graph replayed back to back (the step without its host work)."""
    g = eng.runner.graphs.graphs[eng.runner.graphs.bucket(batch)]
    g.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        g.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / n


def trace_replays(eng: LLMEngine, batch: int, n: int) -> dict:
    """replay_trace.attribute over n replays of the captured decode graph, each profiled on its own (ns)."""
    g = eng.runner.graphs.graphs[eng.runner.graphs.bucket(batch)]
    g.replay()
    torch.cuda.synchronize()
    replays = []
    for _ in range(n):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            g.replay()
            torch.cuda.synchronize()
        spans = [(e.name(), e.start_ns(), e.end_ns()) for e in prof.profiler.kineto_results.events()
                 if e.device_type() == torch.autograd.DeviceType.CUDA and not e.name().startswith("v4serve.")]
        replays.append(replay_trace.attribute(spans))
    return replay_trace.merge(replays)


def mixed_step(eng: LLMEngine, tokens: int, batch: int, acts, cuda: bool, g: torch.Generator,
               lines: list[str], top: int = 0) -> dict:
    """Eager steps of the decoding rows beside a new prompt of `tokens` tokens: one to compile, one timed, one
    profiled by family; and a decode-only eager step after them. A wall time far above the GPU time: the step is host
    bound (what a graph would remove)."""
    dev = eng.device

    def step(prompt: bool) -> float:
        rid = None
        if prompt:
            rid, = eng.add_request(torch.randint(0, eng.model_config.vocab_size, (tokens,), generator=g).tolist(),
                                   SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))
        sync(dev)
        t = time.perf_counter()
        deltas = eng.step()
        sync(dev)
        ms = (time.perf_counter() - t) * 1e3
        # the prompt must run whole in this step (max_tokens=1), else the step timed was the decode rows alone
        if rid is not None and not any(d.request_id == rid and d.finished for d in deltas):
            raise SystemExit(f"mixed step: the {tokens}-token prompt did not finish in one step (chunk or seat limit)")
        return ms

    step(True)  # compiles the prefill's kernels
    wall = step(True)
    profiling.enable()
    with torch.profiler.profile(activities=acts) as prof:
        step(True)
    profiling.enable(False)
    per_kernel: dict = {}
    fams = attribute(prof, cuda, per_kernel)
    gpu = sum(v["ms"] for v in fams.values())
    decode_only = step(False)
    lines += table(f"mixed step: {batch} decode rows + a {tokens}-token prompt (wall {wall:.1f} ms, GPU {gpu:.1f} ms; "
                   f"the decode-only eager step {decode_only:.1f} ms)", fams, {}, 1)
    out = {"tokens": tokens, "wall_ms": wall, "gpu_ms": gpu, "families": fams, "decode_only_eager_ms": decode_only}
    if top and per_kernel:
        top_lines, out["top_kernels"] = top_kernels(per_kernel, 1, top)
        lines += top_lines
    return out


def parse_env(spec: str) -> dict[str, str]:
    """'NAME=VALUE NAME2=VALUE2' -> {NAME: VALUE, ...}; '' -> {} (the environment the process started with)."""
    out = {}
    for item in spec.split():
        name, eq, value = item.partition("=")
        if not eq or not name.startswith("V4SERVE_"):
            raise SystemExit(f"--env-variant wants V4SERVE_NAME=VALUE items, not {item!r}")
        out[name] = value
    return out


def env_variants(eng: LLMEngine, batch: int, specs: list[str], rounds: int, timed) -> list[dict]:
    """The decode graph recaptured under each environment in turn (runtime switches that the step reads as it runs,
    e.g. V4SERVE_OVERLAP or V4SERVE_PDL, not those read at import), its replay and the graphed step timed, the
    variants interleaved over `rounds` rounds: A/B runs without a process (and a model build) per variant."""
    names = {k for spec in specs for k in parse_env(spec)}
    started = {k: os.environ.get(k) for k in names}

    def set_env(values: dict[str, str | None]) -> None:
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    rows = []
    for r in range(rounds):
        for spec in [""] + specs:
            set_env({**started, **parse_env(spec)})
            torch.cuda.synchronize()
            eng.runner.graphs.capture()
            step_ms, rep = timed(), replay_ms(eng, batch)
            rows.append({"env": spec or "as started", "round": r, "graph_step_ms": step_ms, "graph_replay_ms": rep})
            print(f"[{spec or 'as started'}] round {r}: replay {rep:.3f} ms, graphed step {step_ms:.3f} ms",
                  flush=True)
    set_env(started)  # the process's own environment again
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--prefill", type=int, default=8192, help="tokens of the profiled prefill chunk (0: none)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--kernels", default="auto")
    ap.add_argument("--kv-cache-dtype", default="auto", help="auto | bf16 | fp8 | fp4 (the engine flag)")
    ap.add_argument("--kv-cache-memory", type=int, default=16 << 30)
    ap.add_argument("--graphs", action=argparse.BooleanOptionalAction, default=True,
                    help="also time graphed decode steps (a second engine)")
    ap.add_argument("--mixed", default="", help="also profile a step of the decode rows beside a prompt of N tokens, "
                    "for each N of a comma list (the eager mixed step that inter-token latency waits on under load)")
    ap.add_argument("--top", type=int, default=0, help="also list the N costliest decode kernels (GPU)")
    ap.add_argument("--graph-only", action="store_true", help="only the CUDA-graph step time (A/B runs)")
    ap.add_argument("--async-scheduling", action="store_true",
                    help="the engine's async scheduling (each step launched before the last one's tokens are read; the "
                         "engine's default, off here so that the graphed step and its replay compare as before)")
    ap.add_argument("--replay-trace", type=int, default=0,
                    help="with --graph-only: trace N graph replays kernel by kernel (replay_trace.py: each kernel's "
                         "exposed time and the idle time before it)")
    ap.add_argument("--env-variant", action="append", default=[],
                    help="with --graph-only: after the first timing, recapture the decode graph under this environment "
                         "('V4SERVE_NAME=VALUE ...', switches read at run time) and time it; repeatable, the variants "
                         "and the starting environment interleaved over --rounds rounds")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of --env-variant timings")
    ap.add_argument("--out", default=os.environ.get("OUT"))
    args = ap.parse_args()
    for spec in args.env_variant:
        parse_env(spec)  # a malformed variant stops here, before any model is built
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    ceil = {"hbm_bytes_per_s": 4.3e12, "fp8_flops": 1.3e15, "bf16_flops": 7.7e14}
    if cuda:
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "kernels"))
        from common import describe, measure_ceilings

        ceil = measure_ceilings()
        print(describe(ceil), flush=True)
    chunk = max(args.prefill, 2048)
    # room for the tokens every row decodes: while the batch's prompts are prefilled, then 256
    mml = max(args.context, args.prefill) + 256 + prompt_steps(args.batch, args.context, chunk)

    def engine(eager: bool) -> LLMEngine:
        return LLMEngine(args.model, EngineConfig(
            device=str(dev), max_num_seqs=max(args.batch, 1) + (1 if mixed else 0), max_model_len=mml,
            kv_cache_memory=args.kv_cache_memory,
            max_num_batched_tokens=chunk, long_prefill_token_threshold=chunk, enforce_eager=eager,
            cuda_graph_sizes=(args.batch,), enable_prefix_caching=False, kernels=args.kernels,
            kv_cache_dtype=args.kv_cache_dtype, async_scheduling=args.async_scheduling))

    g = torch.Generator().manual_seed(0)
    results: dict = {"model": args.model, "batch": args.batch, "context": args.context, "ceilings": ceil,
                     "kernels": args.kernels}

    n_timed = max(args.steps, 10)  # graphed steps per timing
    # tokens for every timed step: the first timing, then each variant's (the starting environment included) per round
    variant_steps = (len(args.env_variant) + 1) * args.rounds * n_timed if args.env_variant else 0

    mixed = [int(n) for n in args.mixed.split(",") if n]

    def fill(eng: LLMEngine) -> None:
        start_decoding(eng, args.batch, args.context, args.steps + 16 + variant_steps + 4 * len(mixed), g)
        sync(dev)

    def timed_steps(eng: LLMEngine, n: int) -> float:
        sync(dev)
        t = time.perf_counter()
        for _ in range(n):
            eng.step()
        sync(dev)
        return (time.perf_counter() - t) / n * 1e3

    if args.graph_only and cuda:
        geng = engine(eager=False)
        fill(geng)
        ms = timed_steps(geng, n_timed)
        replay = replay_ms(geng, args.batch)
        print(f"decode with CUDA graphs: {ms:.2f} ms/step, of which the graph replay alone "
              f"{replay:.2f} ms (V4SERVE_PDL={os.environ.get('V4SERVE_PDL', '1')})", flush=True)
        # the table row: the floor, the host's share and the launches of one replay
        floor = sum(floors.floor_ms(floors.decode_bytes(geng.model_config, geng.spec, args.batch, args.context), {},
                                    ceil).values())
        trace = trace_replays(geng, args.batch, max(args.replay_trace, 1))
        results.update(graph_step_ms=ms, graph_replay_ms=replay, host_ms=ms - replay, floor_ms=floor,
                       x_floor=ms / floor, kernels_per_step=len(trace["sequence"]),
                       async_scheduling=args.async_scheduling)
        print(f"floor {floor:.3f} ms ({ms / floor:.2f}x); host {ms - replay:.2f} ms; "
              f"{len(trace['sequence'])} launches a replay", flush=True)
        if args.replay_trace:
            print("\n".join(replay_trace.table(trace, top=max(args.top, 25))), flush=True)
        if args.env_variant:
            results["env_variants"] = env_variants(geng, args.batch, args.env_variant, args.rounds,
                                                   lambda: timed_steps(geng, n_timed))
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            tag = f"{args.model}-b{args.batch}"
            with open(os.path.join(args.out, f"graph-{tag}{'-async' if args.async_scheduling else ''}.json"),
                      "w") as f:
                json.dump(results, f, indent=2, default=str)
            if args.replay_trace:
                with open(os.path.join(args.out, f"replay-trace-{tag}.json"), "w") as f:
                    json.dump(trace, f, indent=1)
        return 0
    # The eager profile gives each kernel's GPU span to its family. Under PDL a kernel is launched early and waits on the
    # GPU for its predecessor, so its span covers the wait: an 8K prefill's router, launched behind a 2.6 ms mHC
    # launch, read as 2.7 ms of routing. The profiled steps therefore run without PDL unless V4SERVE_PDL is set; the
    # CUDA-graph timings after them keep the process's setting.
    pdl_started = os.environ.get("V4SERVE_PDL")
    if pdl_started is None:
        os.environ["V4SERVE_PDL"] = "0"
    results["profile_pdl"] = os.environ["V4SERVE_PDL"]
    eng = engine(eager=True)
    c = eng.model_config
    held = held_bytes(eng.loaded.model)
    results["weight_bytes"] = held["device"] + held["host"]
    results["checkpoint_weight_bytes"] = sum(checkpoint_bytes(c, include_mtp=False).values())
    fill(eng)
    results["eager_step_ms"] = timed_steps(eng, args.steps)
    profiling.enable()
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(args.steps):
            eng.step()
        sync(dev)
    profiling.enable(False)
    per_kernel: dict = {}
    dec = attribute(prof, cuda, per_kernel)
    dec_floor = floors.floor_ms(floors.decode_bytes(c, eng.spec, args.batch, args.context), {}, ceil)
    lines = table(f"decode, batch {args.batch}, context {args.context} (per step; eager "
                  f"{results['eager_step_ms']:.2f} ms/step)", dec, dec_floor, args.steps)
    results["decode"] = {"families": {k: {"ms": v["ms"] / args.steps, "launches": v["launches"] / args.steps}
                                      for k, v in dec.items()}, "floor_ms": dec_floor}
    if args.top and per_kernel:
        top_lines, results["decode"]["top_kernels"] = top_kernels(per_kernel, args.steps, args.top)
        lines += top_lines
    if args.mixed:
        results["mixed"] = [mixed_step(eng, n, args.batch, acts, cuda, g, lines, args.top) for n in mixed]
    eng.abort_all()
    eng.step()
    if args.prefill:
        V = c.vocab_size
        eng.add_request(torch.randint(0, V, (args.prefill,), generator=g).tolist(),
                        SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))
        profiling.enable()
        sync(dev)
        t = time.perf_counter()
        with torch.profiler.profile(activities=acts) as prof:
            eng.step()
            sync(dev)
        wall = (time.perf_counter() - t) * 1e3
        profiling.enable(False)
        pre_kernels: dict = {}
        pre = attribute(prof, cuda, pre_kernels)
        pre_floor = floors.floor_ms({}, floors.prefill_flops(c, args.prefill, args.prefill), ceil)
        lines += table(f"prefill chunk of {args.prefill} tokens (wall {wall:.1f} ms under the profiler)", pre,
                       pre_floor, 1)
        results["prefill"] = {"tokens": args.prefill, "families": pre, "floor_ms": pre_floor}
        if args.top and pre_kernels:
            top_lines, results["prefill"]["top_kernels"] = top_kernels(pre_kernels, 1, args.top)
            lines += top_lines
    del eng
    if pdl_started is None:
        os.environ.pop("V4SERVE_PDL", None)
    if cuda and args.graphs:
        torch.cuda.empty_cache()
        geng = engine(eager=False)
        fill(geng)
        results["graph_step_ms"] = timed_steps(geng, max(args.steps, 10))
        results["graph_replay_ms"] = replay_ms(geng, args.batch)
        results["host_ms"] = results["graph_step_ms"] - results["graph_replay_ms"]
        results["kernels_per_step"] = sum(v["launches"] for v in results["decode"]["families"].values())
        lines.append(f"\ngraph replay alone: {results['graph_replay_ms']:.2f} ms (the rest of the step is host work)")
        lines.append(f"\ndecode with CUDA graphs: {results['graph_step_ms']:.2f} ms/step; floor "
                     f"{sum(dec_floor.values()):.3f} ms ({results['graph_step_ms'] / sum(dec_floor.values()):.1f}x)")
    lines.append(f"weights held {results['weight_bytes'] / 1e9:.2f} GB vs checkpoint "
                 f"{results['checkpoint_weight_bytes'] / 1e9:.2f} GB")
    print("\n".join(lines), flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        name = f"profile-{args.model}-b{args.batch}-c{args.context}.json"
        with open(os.path.join(args.out, name), "w") as f:
            json.dump(results, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
