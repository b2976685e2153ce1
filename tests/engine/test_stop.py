"""Stop strings in streamed output: truncation, hold-back, and independence from delta boundaries."""

from __future__ import annotations

import random

import pytest

from v4serve.engine.stop import StopStringStream, check_stop, find_stop, partial_stop_len


def stream(deltas: list[str], stops: list[str], include: bool = False) -> tuple[list[str], str | None]:
    s = StopStringStream(stops, include)
    out = []
    for d in deltas:
        r = s.feed(d)
        out.append(r.text)
        if r.stopped:
            return out, r.stop
    out.append(s.flush())
    return out, None


def reference(text: str, stops: list[str], include: bool) -> tuple[str, str | None]:
    """Text arriving one character at a time; at equal ends the longer stop string wins."""
    for end in range(1, len(text) + 1):
        hits = [s for s in stops if text[:end].endswith(s)]
        if hits:
            stop = max(hits, key=len)
            return text[: end if include else end - len(stop)], stop
    return text, None


def test_check_stop_truncates_before_the_stop_string() -> None:
    r = check_stop("Answer: 42\nUser: next", "42\nUser: next", ["\nUser:"])
    assert r.stopped and r.stop == "\nUser:" and r.text == "Answer: 42" and r.holdback == 0


def test_include_stop_str_in_output_keeps_it_and_drops_what_follows() -> None:
    r = check_stop("Answer: 42\nUser: next", "42\nUser: next", ["\nUser:"], include_stop_str_in_output=True)
    assert r.text == "Answer: 42\nUser:"


def test_holdback_covers_a_possible_stop_prefix() -> None:
    r = check_stop("result is </an", "s </an", ["</answer>"])
    assert not r.stopped and r.text == "result is </an" and r.holdback == 4
    assert check_stop("plain text", "text", ["</answer>"]).holdback == 0
    assert check_stop("abc </an", "</an", ["</answer>"], include_stop_str_in_output=True).holdback == 0


def test_only_matches_ending_in_the_new_delta_count() -> None:
    # the old occurrence was handled (or deliberately not) in an earlier step
    assert find_stop("STOP and more", 4, ["STOP"]) is None
    assert find_stop("xxSTOP", 2, ["STOP"]).start == 2


def test_stop_string_split_across_deltas() -> None:
    out, stop = stream(["Hel", "lo ST", "OP wor", "ld"], ["STOP"])
    assert stop == "STOP" and out == ["Hel", "lo ", ""]


def test_held_text_is_released_when_it_turns_out_not_to_be_a_stop() -> None:
    s = StopStringStream(["STOP"])
    assert s.feed("abc S").text == "abc "
    assert s.feed("T").text == ""
    assert s.feed("ART").text == "START"
    assert s.feed("  ST").text == "  "
    assert s.flush() == "ST"  # end of generation: held text is ordinary output


def test_include_stop_str_split_across_deltas() -> None:
    out, stop = stream(["ab", "cSTO", "Pxyz"], ["STOP"], include=True)
    assert stop == "STOP" and "".join(out) == "abcSTOP" and out[1] == "cSTO"


def test_multiple_stop_strings_first_completed_wins() -> None:
    out, stop = stream(["hello world"], ["world", "lo w"])
    assert stop == "lo w" and "".join(out) == "hel"
    out, stop = stream(["say ", "ab", "c"], ["abc", "b"])
    assert stop == "b" and "".join(out) == "say a"
    # same end: the longer string, whose truncation covers the shorter one
    out, stop = stream(["x", "yz!"], ["yz", "xyz"])
    assert stop == "xyz" and "".join(out) == ""


def test_no_stop_strings_passes_everything_through() -> None:
    s = StopStringStream([])
    assert s.feed("any text").text == "any text" and s.flush() == ""


def test_after_a_stop_nothing_more_is_emitted() -> None:
    s = StopStringStream(["\n\n"])
    assert s.feed("para\n\nnext").text == "para"
    assert s.feed("more").text == "" and s.stopped and s.flush() == ""


def test_partial_stop_len_handles_self_overlapping_stops() -> None:
    assert partial_stop_len("xxaa", ["aab"]) == 2
    assert partial_stop_len("abab", ["ababc"]) == 4
    assert partial_stop_len("ab", ["b", "abc"]) == 2
    assert partial_stop_len("zzz", ["a"]) == 0


@pytest.mark.parametrize("include", [False, True])
def test_result_does_not_depend_on_delta_boundaries(include: bool) -> None:
    rng = random.Random(7 + include)
    for _ in range(400):
        text = "".join(rng.choice("ab c\n") for _ in range(rng.randint(0, 30)))
        stops = [
            "".join(rng.choice("ab c\n") for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 3))
        ]
        cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text) + 1, rng.randint(0, 6))))
        deltas = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)])]
        out, stop = stream(deltas, stops, include)
        assert ("".join(out), stop) == reference(text, stops, include), (text, stops, deltas)
