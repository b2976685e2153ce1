"""DEP request placement (engine/dp_router.py): a session's next turn goes to the rank holding its prefix, a new
session to the least-loaded rank."""

from __future__ import annotations

from v4serve.cache.prefix import block_hashes
from v4serve.engine.dp_router import DataParallelRouter


def test_sessions_stick_and_new_ones_balance() -> None:
    r = DataParallelRouter(2, block_size=16)
    system = list(range(1000, 1016))  # one block shared by every session
    a = system + list(range(200))  # session A's first turn
    assert r.pick(a, None, [0, 0]) == 0  # no prefix known: least loaded (the lower rank on a tie)
    b = system + list(range(500, 700))
    assert r.pick(b, None, [len(a), 0]) == 1  # shares only the system prompt (a small part): least loaded
    assert r.pick(a + [7] * 40, None, [len(a), len(b) + 999]) == 0  # A's next turn: A's rank, though busier
    assert r.pick(b + list(range(30)), None, [0, len(b)]) == 1
    assert r.pick(a, "other-salt", [len(a), 0]) == 1  # another cache salt shares no prefix
    assert r.pick(list(range(5)), None, [3, 2]) == 1  # shorter than a block: least loaded
    assert (r.by_prefix, r.by_load) == (2, 4)


def test_the_rank_caching_the_longest_prefix_wins() -> None:
    r = DataParallelRouter(3, block_size=4)
    prompt = list(range(40))  # 10 blocks
    h = block_hashes(prompt, 4)
    held = {0: set(h[:2]), 1: set(h[:2]), 2: set(h[:7])}  # rank 2 caches 7 of the 10 blocks
    assert r.pick(prompt, None, [0, 0, 100], lambda rank, x: x in held[rank]) == 2
    held[2] = set(h[:4])  # 16 of 40 tokens: less than half, so the least-loaded rank (a router that has not seen it)
    assert DataParallelRouter(3, 4).pick(prompt, None, [5, 0, 100], lambda rank, x: x in held[rank]) == 1


def test_router_forgets_beyond_capacity() -> None:
    r = DataParallelRouter(2, block_size=4, capacity=8)
    for i in range(10):
        r.pick([i] * 8, None, [0, 0])
    assert len(r.routed) == 8
