"""Loader for WEKA-style agentic traces (the format behind the AgentX dataset).

A trace is one JSON object with an ordered `requests` list. A request entry (`type` "n" or "s")
has `t` (timestamp, s), `in`/`out` (tokens), `hash_ids` (chained 64-token block hashes, local to
the trace), `api_time` and `think_time` (s). A `type: "subagent"` entry carries its own
`requests` list (and optionally `system_tokens`/`tool_tokens`); it fans out after the parent
request before it and joins before the parent request after it; adjacent subagent entries with
the same anchor form one parallel group.

Mapping onto the session model: turn i opens with `in_i - (in_{i-1} + out_{i-1})` new tokens when
the hash ids show that the previous prompt is kept as a prefix; otherwise (compaction, edits) the
turn is a `reset` that restarts the context. The theoretical reuse of a request is the leading
run of its blocks already seen earlier in the trace (one seen-set per trace, in time order).
Files: a directory of `*.json`/`*.jsonl`, one `.json` (a trace, a list, or {"traces": [...]}), or
a `.jsonl` with one trace per line.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from v4serve.bench.traces import Conversation, ListTraceSource, SessionTrace, SubagentGroup, Turn

BLOCK_TOKENS = 64
_KEEP_PREFIX = 0.9  # share of the previous prompt's blocks that must survive for an extension


def load_weka_traces(path: str | Path, scale: float = 1.0, max_context: int | None = None) -> ListTraceSource:
    sessions = [
        weka_session(obj, f"{src}:{i}", scale, max_context) for src, i, obj in _read_objects(Path(path))
    ]
    sessions = [s for s in sessions if s.root.turns]
    return ListTraceSource(sessions, name=f"weka:{path}")


def weka_session(
    trace: dict[str, Any], default_id: str, scale: float = 1.0, max_context: int | None = None
) -> SessionTrace:
    sid = str(trace.get("id") or trace.get("trace_id") or default_id)
    block = int(trace.get("block_size") or BLOCK_TOKENS)
    reuse = _reuse_by_request(trace, block)
    root = _chain(f"{sid}/root", trace, reuse, scale, max_context, parent=None)
    return SessionTrace(session_id=sid, root=root)


def _is_request(entry: dict[str, Any]) -> bool:
    return entry.get("type", "n") != "subagent"


def _chain(
    conv_id: str,
    entry: dict[str, Any],
    reuse: dict[int, int],
    scale: float,
    max_context: int | None,
    parent: tuple[dict[str, Any], int] | None,  # (anchor request, parent context after its reply)
) -> Conversation:
    def tokens(n: float) -> int:
        return max(1, round(n * scale))

    requests = [r for r in entry.get("requests", []) if _is_request(r)]
    declared_system = int(entry.get("system_tokens") or 0) + int(entry.get("tool_tokens") or 0)
    conv = Conversation(conv_id=conv_id, turns=[])
    inherit = parent is not None and bool(requests) and _shares_prefix(parent[0], requests[0])
    if inherit:
        conv.inherits_parent = True
    elif requests:
        conv.system_tokens = (
            tokens(min(declared_system, max(0, requests[0]["in"] - 1))) if declared_system else 0
        )
    prev: dict[str, Any] | None = None
    context = parent[1] if inherit and parent else 0
    for req in requests:
        n_in, n_out = tokens(req["in"]), tokens(req["out"])
        if max_context is not None and n_in + n_out > max_context:
            break
        if prev is None:
            base = context if inherit else conv.system_tokens
            turn = Turn(new_tokens=max(1, n_in - base), output_tokens=n_out)
        elif _shares_prefix(prev, req):
            turn = Turn(
                new_tokens=max(1, n_in - tokens(prev["in"]) - tokens(prev["out"])), output_tokens=n_out
            )
        else:
            turn = Turn(new_tokens=max(1, n_in - conv.system_tokens), output_tokens=n_out, reset=True)
        turn.think_time_s = _think_time(prev, req)
        if id(req) in reuse:
            turn.reuse_tokens = round(reuse[id(req)] * scale)
        conv.turns.append(turn)
        prev = req
    _attach_subagents(conv, entry, reuse, scale, max_context)
    return conv


def _attach_subagents(
    conv: Conversation, entry: dict[str, Any], reuse: dict[int, int], scale: float, max_context: int | None
) -> None:
    turn_index, anchor, last_group_anchor = -1, None, None
    for item in entry.get("requests", []):
        if _is_request(item):
            turn_index += 1
            anchor = item
            continue
        if anchor is None or turn_index >= len(conv.turns):
            continue  # no preceding parent turn (or it was cut by max_context): dropped
        turn = conv.turns[turn_index]
        context = round((anchor["in"] + anchor["out"]) * scale)
        name = item.get("agent_id") or f"sa{sum(len(g.children) for g in turn.subagents)}"
        child = _chain(
            f"{conv.conv_id}/t{turn_index}/{name}", item, reuse, scale, max_context, (anchor, context)
        )
        if not child.turns:
            continue
        if last_group_anchor == turn_index and turn.subagents:
            turn.subagents[-1].children.append(child)
        else:
            turn.subagents.append(SubagentGroup([child]))
        last_group_anchor = turn_index


def _shares_prefix(prev: dict[str, Any], req: dict[str, Any]) -> bool:
    a, b = prev.get("hash_ids"), req.get("hash_ids")
    if not a or not b:
        return req["in"] >= prev["in"]  # no hash evidence: growth means extension
    common = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        common += 1
    return common >= _KEEP_PREFIX * len(a)


def _think_time(prev: dict[str, Any] | None, req: dict[str, Any]) -> float:
    if prev is None:
        return 0.0
    if req.get("think_time") is not None:
        return max(0.0, float(req["think_time"]))
    if req.get("t") is not None and prev.get("t") is not None:
        return max(0.0, float(req["t"]) - float(prev["t"]) - float(prev.get("api_time") or 0.0))
    return 0.0


def _reuse_by_request(trace: dict[str, Any], block: int) -> dict[int, int]:
    """Leading blocks of each request already seen earlier in the trace, in tokens (by id())."""
    requests = list(_all_requests(trace))
    if not any(r.get("hash_ids") for r in requests):
        return {}
    order = sorted(range(len(requests)), key=lambda i: (float(requests[i].get("t") or 0.0), i))
    seen: set[Any] = set()
    out: dict[int, int] = {}
    for i in order:
        req = requests[i]
        hashes = req.get("hash_ids") or []
        hit = 0
        for h in hashes:
            if h not in seen:
                break
            hit += 1
        out[id(req)] = min(int(req["in"]), hit * block)
        seen.update(hashes)
    return out


def _all_requests(entry: dict[str, Any]) -> Iterable[dict[str, Any]]:
    for item in entry.get("requests", []):
        if _is_request(item):
            yield item
        else:
            yield from _all_requests(item)


def _read_objects(path: Path) -> Iterable[tuple[str, int, dict[str, Any]]]:
    files = sorted(p for p in path.iterdir() if p.suffix in (".json", ".jsonl")) if path.is_dir() else [path]
    for file in files:
        if file.suffix == ".jsonl":
            lines = (ln for ln in file.read_text().splitlines() if ln.strip())
            for i, line in enumerate(lines):
                yield file.stem, i, json.loads(line)
            continue
        data = json.loads(file.read_text())
        items = data.get("traces", [data]) if isinstance(data, dict) else data
        for i, obj in enumerate(items):
            yield file.stem, i, obj
