"""When a closed-loop client may send: warm-up budget, barrier, measured window, think time.

`PointGate` implements the AgentX warm-up protocol for one concurrency point: every lane first
spends its warm-up budget, then waits at a barrier; when all lanes are there the measured window
opens for everyone at once; when it closes, the next admission raises `WindowClosed` and the
requests already in flight finish (drain).

`Pacer` runs think-time sleeps. A sleep ends early when the window closes (and none starts after
that), or when the whole system has had nothing in flight for `global_idle_cap_s` (AgentX caps
global idle time at 10 s).
"""

from __future__ import annotations

import asyncio
import time


class WindowClosed(Exception):
    """Raised at admission once the measured window is over: the lane stops issuing."""


class PointGate:
    def __init__(self, num_lanes: int, warmup_requests: int) -> None:
        self.num_lanes = num_lanes
        self._warmup_left = [warmup_requests] * num_lanes
        self._ready: set[int] = set()
        self._released = asyncio.Event()
        self.closed = False
        self.window_start: float | None = None  # perf_counter time
        self.warmup_done = 0

    @property
    def released(self) -> bool:
        return self._released.is_set()

    async def admit(self, lane: int, prime: bool = False) -> str:
        """The phase of the next request of `lane`; blocks at the barrier after warm-up."""
        if self.closed:
            raise WindowClosed
        if prime and not self.released:
            return "prime"
        if not self.released:
            if self._warmup_left[lane] > 0:
                self._warmup_left[lane] -= 1
                self.warmup_done += 1
                return "warmup"
            self.lane_ready(lane)
            await self._released.wait()
            if self.closed:
                raise WindowClosed
        return "measured"

    def lane_ready(self, lane: int) -> None:
        """Mark a lane as waiting at the barrier (or gone); the last one opens the window."""
        self._ready.add(lane)
        if len(self._ready) >= self.num_lanes:
            self.release()

    def release(self) -> None:
        if not self.released:
            self.window_start = time.perf_counter()
            self._released.set()

    async def wait_released(self) -> None:
        await self._released.wait()

    def close(self) -> None:
        self.closed = True
        self._released.set()  # lanes still at the barrier must see the close


class Pacer:
    def __init__(self, global_idle_cap_s: float | None = 10.0) -> None:
        self.global_idle_cap_s = global_idle_cap_s
        self.inflight = 0
        self.max_inflight = 0
        self._idle_since: float | None = time.perf_counter()
        self._wake = asyncio.Event()
        self.closed = False

    def started(self) -> None:
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        self._idle_since = None

    def finished(self) -> None:
        self.inflight -= 1
        if self.inflight == 0:
            self._idle_since = time.perf_counter()

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0 or self.closed:
            return
        try:
            await asyncio.wait_for(self._wake.wait(), seconds)
        except TimeoutError:
            pass

    def wake_all(self) -> None:
        # Sleepers hold the old event; later sleeps use a fresh one.
        self._wake.set()
        self._wake = asyncio.Event()

    def close(self) -> None:
        """The window is over: end every think time now and skip later ones (drain quickly)."""
        self.closed = True
        self.wake_all()

    async def watch_idle(self) -> None:
        """Background task: wakes every sleeper once the system has been idle for the cap."""
        cap = self.global_idle_cap_s
        if cap is None or cap <= 0:
            return
        while True:
            await asyncio.sleep(min(0.25, cap / 4))
            if self._idle_since is not None and time.perf_counter() - self._idle_since >= cap:
                self._idle_since = time.perf_counter()
                self.wake_all()
