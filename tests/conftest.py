"""Test-wide setup. TRITON_INTERPRET must be set before any Triton kernel module is imported."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1") if not os.environ.get("V4SERVE_TEST_DEVICE", "").startswith("cuda") else None
