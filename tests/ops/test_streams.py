"""The side-stream switch (ops/streams.py). The overlap itself needs a GPU: tests/gpu/test_cuda.py checks that it
changes no value, eagerly and under CUDA graphs."""

from __future__ import annotations

import pytest
import torch

from v4serve.ops import streams


def test_overlap_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(streams.OVERLAP_ENV, raising=False)
    assert streams.overlapped("shared_expert") is ("shared_expert" in streams.DEFAULT_OVERLAPS)
    for value, on in (("shared_expert", True), ("all", True), ("none", False), ("", False)):
        monkeypatch.setenv(streams.OVERLAP_ENV, value)
        assert streams.overlapped("shared_expert") is on
    monkeypatch.setenv(streams.OVERLAP_ENV, "shared_expert,typo")
    with pytest.raises(ValueError, match="typo"):
        streams.overlapped("shared_expert")
    with pytest.raises(ValueError, match="unknown overlap"):
        streams.overlapped("nothing")


def test_no_fork_off_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU tensors (and the switch off) run inline: no fork, so the model's plain path is taken."""
    monkeypatch.setenv(streams.OVERLAP_ENV, "shared_expert")
    assert streams.fork("shared_expert", torch.zeros(2)) is None
