"""The fastest prefill variant of an attention.py JSON (CSA + HCA time) as a V4SERVE_ATTN_PREFILL spec.

    python benchmarks/kernels/attention_best.py OUT/attention-bf16.json   # prints "" when the default won
"""

from __future__ import annotations

import json
import sys

from attention import VARIANTS


def spec(path: str) -> str:
    tot: dict[str, dict[str, float]] = {}
    for r in json.load(open(path))["rows"]:
        if r["phase"] == "prefill":
            tot.setdefault(r["variant"], {})[r["layer"]] = r["ms"]
    both = {k: v["csa"] + v["hca"] for k, v in tot.items() if len(v) == 2}
    c = VARIANTS[min(both, key=both.get)]
    if c is None:
        return ""
    if c.mode == "twopass":
        return f"twopass,{c.rows},{c.num_warps},{c.dchunk}"
    return f"{c.heads},{c.rows},{c.num_warps},{c.prefetch},{int(c.dsplit == 2)}" if c.mode == "flash" else ""


if __name__ == "__main__":
    print(spec(sys.argv[1]))
