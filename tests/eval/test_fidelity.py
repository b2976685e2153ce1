"""`v4serve eval fidelity`: bounded replay measured against exact serving of the same cached sessions."""

from __future__ import annotations

import math

import pytest

from v4serve.eval.fidelity import format_fidelity, make_sessions, run_fidelity

KW = {"device": "cpu", "block_size": 32, "max_num_seqs": 2, "kv_cache_memory": 64 << 20}


def test_fidelity_reports_divergence_of_bounded_replay() -> None:
    sessions = make_sessions(2, prompt_len=100, new_len=20, seed=5)
    r = run_fidelity("tiny-v41-flash", sessions, continuation=6, engine_kwargs=KW, reply_len=8)
    assert r["sessions"] == 2 and len(r["kl_by_position"]) == 6 and len(r["top1_by_position"]) == 6
    assert all(math.isfinite(v) and v >= 0 for v in r["kl_by_position"])
    assert 0.0 <= r["top1_agreement"] <= 1.0 and r["kl_max"] >= r["kl_median"] >= 0
    # exact serving after a cache hit reproduces its own cold greedy continuation token for token
    assert r["exact_reproduces_itself"]["identical_share"] == 1.0
    # both engines served turn 2 from the cache, each by its own mechanism
    assert all(c > 0 for c in r["cached_tokens"]["exact"]) and all(c > 0 for c in r["cached_tokens"]["bounded"])
    assert "bounded_replay" in r["hit_kinds"]["bounded"] and "bounded_replay" not in r["hit_kinds"]["exact"]
    assert "KL(exact || bounded)" in format_fidelity(r)


def test_fidelity_refuses_v4_models() -> None:
    from v4serve.cli import main

    assert main(["eval", "fidelity", "tiny-v4-flash", "--sessions", "1"]) == 2
