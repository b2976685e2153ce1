"""Where and in what precision the engine tests run.

Exact-equivalence tests (batched vs alone, cached vs cold) run in float64: the reference's FP8/FP4 simulations and the
indexer's top-k are discontinuous, so float32 rounding that differs between GEMM shapes (it does on some CPUs, and
always on GPUs) could flip one quantization step. With V4SERVE_TEST_DEVICE=cuda they run on the GPU.
"""

import os

DEVICE = "cuda" if os.environ.get("V4SERVE_TEST_DEVICE", "").startswith("cuda") else "cpu"
EXACT_DTYPE = "float64"
ENGINE = {"device": DEVICE, "dtype": EXACT_DTYPE}
