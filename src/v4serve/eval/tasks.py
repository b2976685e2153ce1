"""What an eval task is: items with an expected answer, a prompt builder and a grader."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class EvalItem:
    id: str
    messages: list[dict[str, str]]
    expected: str
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class EvalTask:
    name: str
    extract: Callable[[EvalItem, str], str | None]  # model output -> answer (None: none found)
    is_correct: Callable[[EvalItem, str | None], bool]
