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


def test_call_site_default_applies_only_when_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model may keep an overlap off by default (V4.1's queries until their GPU check runs); naming it turns it on."""
    monkeypatch.delenv(streams.OVERLAP_ENV, raising=False)
    assert "attention_query" in streams.DEFAULT_OVERLAPS
    assert streams.overlapped("attention_query") is True
    assert streams.overlapped("attention_query", default=False) is False
    assert streams.overlapped("shared_expert", default=True) is True
    with pytest.raises(ValueError, match="unknown overlap"):
        streams.overlapped("nothing", default=False)
    monkeypatch.setenv(streams.OVERLAP_ENV, "attention_query")
    assert streams.overlapped("attention_query", default=False) is True
    monkeypatch.setenv(streams.OVERLAP_ENV, "none")
    assert streams.overlapped("attention_query", default=True) is False


def test_no_fork_off_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU tensors (and the switch off) run inline: no fork, so the model's plain path is taken."""
    monkeypatch.setenv(streams.OVERLAP_ENV, "shared_expert")
    assert streams.fork("shared_expert", torch.zeros(2)) is None


def test_beside_runs_inline_off_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """`beside` without a fork runs fn at once and its getter returns that result (no second run); an unknown name
    is refused even then."""
    monkeypatch.setenv(streams.OVERLAP_ENV, "all")
    calls = []
    get = streams.beside("attention_query", torch.zeros(2), lambda: calls.append(1) or torch.ones(3))
    assert calls == [1]
    assert torch.equal(get(), torch.ones(3)) and get() is get() and calls == [1]
    with pytest.raises(ValueError, match="unknown overlap"):
        streams.beside("nothing", torch.zeros(2), list)


def test_side_lane_keeps_arrival_counters_apart() -> None:
    """Launches on a side stream (inside Fork.run's side_lane) take other arrival counters than the main stream's, so
    one kernel family may run on both streams at once; the lane is restored on the way out, errors included."""
    from v4serve.ops.kernels import split_grid

    assert split_grid.current_lane() == 0
    with split_grid.side_lane():
        assert split_grid.current_lane() == 1
    with pytest.raises(RuntimeError), split_grid.side_lane():
        raise RuntimeError
    assert split_grid.current_lane() == 0
    if torch.cuda.is_available():
        counters = split_grid.ArrivalCounters(16)
        main = counters.get(torch.device("cuda"))
        with split_grid.side_lane():
            side = counters.get(torch.device("cuda"))
        assert side.data_ptr() != main.data_ptr() and counters.get(torch.device("cuda")) is main
