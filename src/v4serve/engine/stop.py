"""Stop strings for streamed output.

Two questions per step: did a stop string just complete, and how much of the text tail must we
hold back from the stream because it may be the start of one (we cannot take text back once it
is sent). Rules, independent of how the text was cut into deltas:

* Only matches that end inside the new delta are looked for; older text was checked before.
* If several stop strings complete, the one that ends first wins (it would have been seen first
  had the text arrived one character at a time); on equal ends the longer one (earlier start).
* The output is truncated before the stop string, or after it with `include_stop_str_in_output`.
  In the latter case nothing needs holding back: a partial stop string is emitted anyway.

`check_stop` works on the accumulated text; `StopStringStream` keeps only the last
len(longest stop) - 1 characters, so per-step cost is O(len(delta) + stop lengths) whatever the
length of the output.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StopMatch:
    stop: str  # the stop string that matched
    start: int  # its position in the searched text
    end: int


def find_stop(text: str, new_chars: int, stops: Sequence[str]) -> StopMatch | None:
    """The earliest-ending stop string occurrence that ends within the last `new_chars` chars."""
    old_len = len(text) - new_chars
    best: StopMatch | None = None
    for stop in stops:
        # an occurrence ending after old_len starts after old_len - len(stop)
        start = text.find(stop, max(0, old_len - len(stop) + 1))
        if start < 0:
            continue
        match = StopMatch(stop, start, start + len(stop))
        if best is None or (match.end, match.start) < (best.end, best.start):
            best = match
    return best


def partial_stop_len(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
    longest = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:k]):
                longest = k
                break
    return longest


@dataclass(frozen=True)
class StopCheck:
    """Result of `check_stop`: `text` is the output so far, truncated if a stop string matched;
    `holdback` trailing characters of it must not be streamed yet (0 once stopped)."""

    text: str
    stop: str | None = None
    holdback: int = 0

    @property
    def stopped(self) -> bool:
        return self.stop is not None


def check_stop(
    text: str, delta: str, stops: Sequence[str], include_stop_str_in_output: bool = False
) -> StopCheck:
    """`text` is the accumulated output *including* `delta`, its newest part."""
    if not stops:
        return StopCheck(text)
    match = find_stop(text, len(delta), stops)
    if match is not None:
        cut = match.end if include_stop_str_in_output else match.start
        return StopCheck(text[:cut], match.stop)
    holdback = 0 if include_stop_str_in_output else partial_stop_len(text, stops)
    return StopCheck(text, None, holdback)


@dataclass(frozen=True)
class StreamDelta:
    text: str  # safe to send now
    stop: str | None = None  # the stop string that ended the output, if any

    @property
    def stopped(self) -> bool:
        return self.stop is not None


class StopStringStream:
    """Per-request stop-string filter between the detokenizer and the client.

    `feed(delta)` returns what may be streamed now; once it reports `stopped`, the request is done
    and further input is ignored. `flush()` releases held-back text when generation ends for
    another reason (EOS, max_tokens). The concatenation of everything returned is the final text.
    """

    def __init__(self, stops: Sequence[str], include_stop_str_in_output: bool = False) -> None:
        self.stops = [s for s in stops if s]
        self.include_stop_str_in_output = include_stop_str_in_output
        # A match ending in a later delta starts at most len(stop) - 1 chars before it, so that
        # much tail is all the context we keep; its last `_held` chars are not yet streamed.
        self._context = max((len(s) for s in self.stops), default=1) - 1
        self._tail = ""
        self._held = 0
        self.stop: str | None = None

    def feed(self, delta: str) -> StreamDelta:
        if self.stop is not None:
            return StreamDelta("", self.stop)
        if not self.stops:
            return StreamDelta(delta)
        window = self._tail + delta
        sent = len(self._tail) - self._held  # chars of `window` already streamed
        result = check_stop(window, delta, self.stops, self.include_stop_str_in_output)
        if result.stopped:
            # the cut never falls in streamed text: a match's pre-delta part was a partial stop
            # string, hence held back (or, with include_stop_str_in_output, the cut is its end)
            self.stop = result.stop
            self._tail, self._held = "", 0
            return StreamDelta(result.text[sent:], result.stop)
        ready = window[sent : len(window) - result.holdback]
        self._tail = window[len(window) - min(len(window), self._context) :]
        self._held = result.holdback
        return StreamDelta(ready)

    def flush(self) -> str:
        """End of output without a stop string: the held-back tail is ordinary text after all."""
        held = self._tail[len(self._tail) - self._held :] if self._held else ""
        self._tail, self._held = "", 0
        return held

    @property
    def stopped(self) -> bool:
        return self.stop is not None
