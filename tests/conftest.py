"""Test-wide setup.

TRITON_INTERPRET must be set before any Triton kernel module is imported. Torch runs single-threaded: the
suite starts engine subprocesses next to the test process, and OpenMP threads spinning on 2 shared cores slow
small ops by orders of magnitude.
"""

import os

if not os.environ.get("V4SERVE_TEST_DEVICE", "").startswith("cuda"):
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(1)
