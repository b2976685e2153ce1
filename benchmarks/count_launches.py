"""Launches per decode step by op family and kind, counted on the CPU: Triton kernels (under the interpreter) and the
torch ops between them, each of which is at least one kernel launch on a GPU (views and allocations excluded).

    python benchmarks/count_launches.py [tiny-v4-flash] [--batch 1] [--context 300] [--prompt 0]

The tiny presets run the same code per layer as the full geometries (one launch list per layer kind), so the per-layer
counts are the GPU's, without a GPU. Prints the launches of one decode step by family, then the torch ops by name: the
glue to fuse away. `--prompt N` counts a mixed step instead: the decode rows beside a new N-token prompt (an eager
step on a GPU: its host time grows with its launches).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter, defaultdict

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from decoding import prompt_steps, start_decoding  # noqa: E402

from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

from v4serve.engine.config import EngineConfig  # noqa: E402
from v4serve.engine.llm_engine import LLMEngine  # noqa: E402
from v4serve.engine.sampling_params import SamplingParams  # noqa: E402
from v4serve.ops import profiling  # noqa: E402

PREFIX = "v4serve."
# ops that launch nothing on a GPU (views, metadata, allocations, host-side reads)
FREE = {"aten::view", "aten::as_strided", "aten::slice", "aten::select", "aten::unsqueeze", "aten::squeeze",
        "aten::reshape", "aten::_reshape_alias", "aten::expand", "aten::t", "aten::transpose", "aten::permute",
        "aten::alias", "aten::detach", "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::unflatten",
        "aten::flatten", "aten::view_as", "aten::lift_fresh", "aten::resolve_conj", "aten::resolve_neg",
        "aten::result_type", "aten::is_nonzero", "aten::item", "aten::_local_scalar_dense", "aten::numpy_T",
        "aten::split", "aten::split_with_sizes", "aten::unbind", "aten::chunk", "aten::narrow", "aten::squeeze_", "aten::unsqueeze_",
        "aten::contiguous", "aten::to", "aten::_to_copy", "aten::new_empty", "aten::dim", "aten::size",
        "aten::stride", "aten::is_same_size", "aten::_unsafe_view", "aten::broadcast_tensors", "aten::as_strided_",
        "aten::set_", "aten::resize_", "aten::_nested_tensor_from_mask_left_aligned", "aten::view_as_real"}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="tiny-v4-flash")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--prompt", type=int, default=0, help="count a mixed step: the rows beside a new prompt")
    ap.add_argument("--dtype", default="bfloat16", help="the GPU's activation dtype picks the GPU's kernels")
    args = ap.parse_args()
    budget = max(256, args.prompt + args.batch)
    eng = LLMEngine(args.model, EngineConfig(device="cpu", max_num_seqs=args.batch,
                                             max_model_len=args.context + 64 + prompt_steps(args.batch, args.context, budget),
                                             enable_prefix_caching=False, kernels="triton", dtype=args.dtype,
                                             max_num_batched_tokens=budget))
    g = torch.Generator().manual_seed(0)
    start_decoding(eng, args.batch, args.context, 16, g, warm_steps=1)
    if args.prompt:
        eng.add_request(torch.randint(0, eng.model_config.vocab_size, (args.prompt,), generator=g).tolist(),
                        SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))

    run = InterpretedFunction.run

    def traced(self, *a, **k):
        with torch.profiler.record_function(f"triton::{self.fn.__name__}"):
            return run(self, *a, **k)

    InterpretedFunction.run = traced
    profiling.enable(True)
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            eng.step()
    finally:
        profiling.enable(False)
        InterpretedFunction.run = run
    events = prof.events()
    ranges = defaultdict(list)
    for e in events:
        if e.name.startswith(PREFIX):
            ranges[e.thread].append((e.time_range.start, e.time_range.end, e.name[len(PREFIX):]))

    def family(e) -> str:
        best, start = "other", -1
        for s, t, name in ranges.get(e.thread, []):
            if s <= e.time_range.start <= t and s > start:
                best, start = name, s
        return best

    def under(e, prefix: str) -> bool:
        p = e.cpu_parent
        while p is not None and not p.name.startswith(prefix):
            p = p.cpu_parent
        return p is not None

    fams: dict[str, Counter] = defaultdict(Counter)
    for e in events:
        if e.name.startswith("triton::"):
            fams[family(e)][e.name] += 1
        # an aten op not called by another (their children are their own implementation), outside Triton's launches
        elif e.name.startswith("aten::") and e.name not in FREE and not under(e, "aten::") and not under(e, "triton::"):
            fams[family(e)][e.name] += 1
    layers = eng.model_config.n_layers
    total = sum(sum(c.values()) for c in fams.values())
    print(f"{args.model}, batch {args.batch}: {total} launches in one {'mixed' if args.prompt else 'decode'} step ({total / layers:.1f} per layer, "
          f"{layers} layers; torch ops counted as one launch each)")
    for fam, c in sorted(fams.items(), key=lambda kv: -sum(kv[1].values())):
        n = sum(c.values())
        print(f"\n{fam}: {n} ({n / layers:.1f} per layer)")
        for name, k in c.most_common():
            print(f"  {k:5d}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
