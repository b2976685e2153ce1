"""Reasoning controls and accounting: the effort text a prompt starts with, and how many generated tokens
were reasoning.

DeepSeek-V4 has two prompt levels: "max" (a fixed preamble, thinking mode only) and everything else (no
text at all; "high" renders exactly like no effort). V4.1 takes a budget 1-100 with names low = 50,
high = 75 (the default) and max = 100, written as one line at the start of the prompt. The V4.1 names and
line come from public V4.1 encoders and are unverified here: no V4.1 reference encoder is available.
Invalid efforts raise ValueError (chat.encode_chat turns it into ChatFormatError).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

Family = Literal["v4", "v41"]

THINK_END_ID = 128822
DSML_ID = 128825

MAX_EFFORT_PREAMBLE = (
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the "
    "root cause, rigorously stress-testing your logic against all potential paths, edge cases, and "
    "adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
    "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n"
)
_V41_BUDGET_LINE = (
    "Reasoning Effort: {budget} (range 1-100, the higher the value, the more thorough the reasoning)\n\n"
)
# OpenAI clients also send minimal/medium/xhigh (Codex defaults to medium): map them onto the nearest level.
_V41_BUDGETS = {"minimal": 50, "low": 50, "medium": 75, "high": 75, "xhigh": 75, "max": 100}


def reasoning_budget(effort: str | int | None) -> int:
    """V4.1's numeric reasoning effort (1-100) for a name or an int; None is the default, high."""
    if effort is None:
        return _V41_BUDGETS["high"]
    if isinstance(effort, bool) or not isinstance(effort, int | str):
        # ValueError, not TypeError: a bad request field, answered with HTTP 400 like the others
        message = f"reasoning_effort must be a name or an integer 1-100, got {effort!r}"
        raise ValueError(message)  # noqa: TRY004
    if isinstance(effort, int):
        if not 1 <= effort <= 100:
            raise ValueError(f"reasoning_effort must be within 1-100, got {effort}")
        return effort
    if effort not in _V41_BUDGETS:
        raise ValueError(f"unknown reasoning_effort {effort!r}; expected one of {', '.join(_V41_BUDGETS)}")
    return _V41_BUDGETS[effort]


def effort_preamble(effort: str | int | None, family: Family, thinking: bool) -> str:
    """The text that follows BOS; the effort is validated in chat mode too, where it adds nothing."""
    if family == "v41":
        line = _V41_BUDGET_LINE.format(budget=reasoning_budget(effort))
    elif isinstance(effort, int) and not isinstance(effort, bool):
        raise ValueError("a numeric reasoning_effort is V4.1 only; DeepSeek-V4 takes a name")
    else:
        reasoning_budget(effort)  # validates the name
        line = MAX_EFFORT_PREAMBLE if effort == "max" else ""
    return line if thinking else ""


def count_reasoning_tokens(
    token_ids: Sequence[int], thinking: bool, *, think_end_id: int = THINK_END_ID, dsml_id: int = DSML_ID
) -> int:
    """Generated tokens that are reasoning (for usage.completion_tokens_details.reasoning_tokens): those
    before `</think>`; when the model opened a tool call without closing its reasoning, those before the
    first DSML token (the "<" of that tag is counted); all of them if reasoning never ended. With a forced
    prefix (chat.forced_prefix) the prompt already closed the reasoning: pass thinking=False."""
    if not thinking:
        return 0
    for i, tok in enumerate(token_ids):
        if tok == think_end_id or tok == dsml_id:
            return i
    return len(token_ids)
