"""Prefix caching across the turns of an agent session (V4: exact hits only)."""

from __future__ import annotations

import random

import pytest

from v4serve.cache.prefix import BlockPool, CheckpointStore, block_hashes
from v4serve.engine.config import EngineConfig
from v4serve.engine.llm_engine import LLMEngine
from v4serve.engine.sampling_params import SamplingParams

from .common import ENGINE
from .test_engine_batching import BLOCK, pool_bytes, run_alone

PRESET = "tiny-v4-flash"


def session(seed: int, turns: int = 3) -> tuple[list[int], list[list[int]]]:
    rng = random.Random(seed)
    first = [rng.randrange(1000, 100000) for _ in range(150)]
    news = [[rng.randrange(1000, 100000) for _ in range(rng.randrange(20, 60))] for _ in range(turns - 1)]
    return first, news


def run_session(eng: LLMEngine, seed: int, turns: int = 3, max_tokens: int = 10, salt: str | None = None):
    first, news = session(seed, turns)
    prompt = first
    results = []
    sp = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    for t in range(turns):
        rid = eng.add_request(prompt, sp, cache_salt=salt)[0]
        while eng.has_unfinished():
            eng.step()
        req = eng.requests[rid]
        results.append((list(prompt), list(req.output_token_ids), req.num_cached_tokens))
        if t < turns - 1:
            prompt = prompt + req.output_token_ids + news[t]  # the next turn extends this one
    return results


@pytest.mark.parametrize("checkpoints", [None, 0], ids=["window-checkpoints", "exact-replay"])
def test_multi_turn_hits_are_exact(checkpoints: int | None) -> None:
    eng = LLMEngine(PRESET, EngineConfig(**ENGINE, block_size=BLOCK, max_num_seqs=2, num_window_checkpoints=checkpoints,
                                         kv_cache_memory=pool_bytes(PRESET, 120, 4)))
    results = run_session(eng, seed=3)
    replay = eng.kv.g.replay_depth
    for t, (prompt, out, cached) in enumerate(results):
        assert out == run_alone(PRESET, prompt, 10), f"turn {t} differs from a cold run"
        if t == 0:
            assert cached == 0
            continue
        prev_prompt, prev_out, _ = results[t - 1]
        shared = (len(prev_prompt) + len(prev_out) - 1) // BLOCK * BLOCK  # blocks whose KV the last turn computed
        align = eng.kv.g.group_align
        documented = shared if checkpoints is None else (shared - replay) // align * align
        assert cached >= documented, f"turn {t}: cached {cached} < {documented}"
        assert cached % BLOCK == 0 or checkpoints == 0
    stats = eng.stats()
    kind = "checkpoint" if checkpoints is None else "exact_replay"
    assert stats["prefix_hit_kinds"].get(kind) == 2
    assert stats["cached_tokens"] == sum(r[2] for r in results)


def test_cache_salt_isolates_sessions() -> None:
    eng = LLMEngine(PRESET, EngineConfig(**ENGINE, block_size=BLOCK, max_num_seqs=2, kv_cache_memory=pool_bytes(PRESET, 120, 4)))
    a = run_session(eng, seed=4, turns=1, salt="alice")
    b = run_session(eng, seed=4, turns=1, salt="bob")
    c = run_session(eng, seed=4, turns=1, salt="alice")
    assert a[0][2] == 0 and b[0][2] == 0, "a different salt must not hit another session's prefix"
    assert c[0][2] > 0, "the same salt and prompt must hit"
    assert eng.stats()["prefix_miss_reasons"]["no_prefix"] == 2


def test_disabled_prefix_caching_reports_no_hits() -> None:
    eng = LLMEngine(PRESET, EngineConfig(**ENGINE, block_size=BLOCK, max_num_seqs=2, enable_prefix_caching=False,
                                         kv_cache_memory=pool_bytes(PRESET, 120, 4)))
    results = run_session(eng, seed=5, turns=2)
    assert [r[2] for r in results] == [0, 0]
    assert eng.stats()["prefix_miss_reasons"] == {"disabled": 2}


# --- the data structures ---------------------------------------------------------------------------------
def test_block_hashes_chain_and_salt() -> None:
    toks = list(range(100))
    h = block_hashes(toks, 32)
    assert len(h) == 3  # only full blocks
    assert block_hashes(toks[:64] + [7] * 36, 32)[:2] == h[:2]  # equal prefixes, equal hashes
    assert block_hashes([5] + toks[1:], 32)[1] != h[1]  # a change in block 0 changes every later hash
    assert block_hashes(toks, 32, salt="x")[0] != h[0]
    assert block_hashes(toks, 32, start=h[:1]) == h  # extending a computed chain


def test_block_pool_reuses_uncached_blocks_before_evicting_cached_prefixes() -> None:
    pool = BlockPool(4, caching=True)
    evicted = []
    pool.on_evict = evicted.append
    a, b, c, d = (pool.allocate() for _ in range(4))
    assert pool.allocate() is None
    pool.register(a, b"ha")
    pool.register(b, b"hb")
    for x in (a, b, c, d):
        pool.release(x)
    assert pool.num_free == 4 and pool.num_cached == 2
    assert {pool.allocate(), pool.allocate()} == {c, d}, "uncached blocks go first"
    assert pool.lookup(b"ha") == a and pool.lookup(b"hb") == b
    pool.acquire(b)  # a hit on b makes a the least recently used cached block
    assert pool.allocate() == a
    assert evicted == [b"ha"] and pool.lookup(b"ha") is None and pool.was_evicted(b"ha")
    assert pool.lookup(b"hb") == b


def test_checkpoint_store_is_lru_and_bounded() -> None:
    store = CheckpointStore([10, 11])
    assert store.take(b"a") == 10 and store.take(b"b") == 11
    assert store.take(b"a") is None  # already stored: refreshed, no new slot
    assert store.take(b"c") == 11  # evicts b, the least recently used
    assert store.lookup(b"b") is None and store.lookup(b"a") == 10 and store.lookup(b"c") == 11
    store.drop(b"a")
    assert store.take(b"d") == 10
