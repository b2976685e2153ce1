"""Answer extraction from free-form model output: final numbers (GSM8K) and option letters (GPQA).

Both look for the most explicit marker first and fall back to weaker evidence:
numbers: `#### N` > `\\boxed{N}` > "answer is N" / "Answer: N" > the last number in the text;
letters: "Answer: X" > `\\boxed{X}` > "answer is (X)" > "Final: X" > a last line that is only the letter.
The last occurrence wins, since models often restate earlier guesses before concluding. Any
reasoning wrapped in <think>...</think> is dropped first.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_NUM = r"-?\$?\s?\d[\d,]*(?:\.\d+)?|-?\$?\s?\.\d+"
_NUM_RE = re.compile(_NUM)
_HASH_RE = re.compile(r"####\s*(" + _NUM + ")")
_ANSWER_NUM_RE = re.compile(r"answer\s*(?:is|:|=)?\s*[:=]?\s*\**\s*(" + _NUM + ")", re.IGNORECASE)


def strip_reasoning(text: str) -> str:
    """Drop inline reasoning: everything up to the last </think>."""
    end = text.rfind("</think>")
    return text[end + len("</think>") :] if end >= 0 else text


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}), with nested braces."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth, begin = 1, i
    while i < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    return text[begin : i - 1] if depth == 0 else None


def normalize_number(text: str) -> str | None:
    """Canonical decimal string: '1,234.50' -> '1234.5', '$18' -> '18', '18.' -> '18'."""
    cleaned = re.sub(r"\\[,!; ]|\\text\{[^}]*\}|\\%|[$%\s]|,", "", text).rstrip(".")
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        return None
    normalized = format(value.normalize(), "f")
    return "0" if normalized in ("-0", "") else normalized


def extract_number(response: str) -> str | None:
    # LaTeX thousands separators: 1{,}000 and 1\,000.
    text = strip_reasoning(response).replace("{,}", ",").replace("\\,", "")
    candidates: list[str] = []
    if m := _HASH_RE.findall(text):
        candidates.append(m[-1])
    elif (boxed := last_boxed(text)) is not None and (nums := _NUM_RE.findall(boxed)):
        candidates.append(nums[-1])
    elif m := _ANSWER_NUM_RE.findall(text):
        candidates.append(m[-1])
    elif nums := _NUM_RE.findall(text):
        candidates.append(nums[-1])
    for candidate in candidates:
        if (value := normalize_number(candidate)) is not None:
            return value
    return None


def numbers_equal(predicted: str | None, expected: str) -> bool:
    if predicted is None:
        return False
    a, b = normalize_number(predicted), normalize_number(expected)
    if a is None or b is None:
        return False
    return abs(Decimal(a) - Decimal(b)) <= Decimal("1e-6") * max(Decimal(1), abs(Decimal(b)))


def extract_choice(response: str, num_choices: int = 4) -> str | None:
    letters = "ABCDEFGHIJ"[:num_choices]
    text = strip_reasoning(response)
    opt = rf"[\(\[\*]*\s*([{letters}])\s*[\)\]\*]*"
    # Keywords are case-insensitive, letters are not ("answer: a detailed ..." is no answer).
    patterns = [
        rf"(?i:answer)\s*[:：]\s*\**\s*(?:\\boxed\{{)?\s*(?:\\text\{{)?{opt}(?![A-Za-z])",
        rf"\\boxed\{{\s*(?:\\text\{{)?\s*([{letters}])\s*\}}",
        rf"(?i:answer\s+is)\s*[:：]?\s*\**\s*{opt}(?![A-Za-z])",
        rf"(?i:option|choice)\s+{opt}\s+(?i:is\s+(?:correct|right))",
        rf"(?i:final)\s*[:：]\s*{opt}(?![A-Za-z])",
    ]
    for pattern in patterns:
        if found := re.findall(pattern, text):
            return found[-1]
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    if lines and (m := re.fullmatch(rf"[\(\[\*]*([{letters}])[\)\]\*\.]*", lines[-1])):
        return m.group(1)
    return None
