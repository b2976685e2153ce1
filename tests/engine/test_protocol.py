"""The engine-process wire types carry every sampling option and every delta field (no silent drift)."""

from __future__ import annotations

import dataclasses

from v4serve.engine import protocol as P
from v4serve.engine.request import StepDelta
from v4serve.engine.sampling_params import SamplingParams


def test_sampling_message_mirrors_sampling_params() -> None:
    params = {f.name: f for f in dataclasses.fields(SamplingParams)}
    assert set(P.SamplingMsg.__struct_fields__) == set(params)
    msg = P.SamplingMsg()
    for name, f in params.items():
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        assert getattr(msg, name) == default, f"default of {name} differs between the wire and SamplingParams"


def test_delta_message_mirrors_step_delta_and_round_trips() -> None:
    assert set(P.Delta.__struct_fields__) == {f.name for f in dataclasses.fields(StepDelta)}
    d = P.Deltas([P.Delta("r#1", [5, 6], "hé", True, "stop", "</x>", [{5: -0.5}], 3, 2, 1)], 0.01, 4)
    back = P.decode_from_engine(P.encode(d))
    assert back == d and back.items[0].new_logprobs == [{5: -0.5}]
