"""The session-trace model shared by every trace source, and its workload statistics.

A session is a tree of conversations. Each conversation is a chain of turns; turn t's prompt is
turn t-1's prompt + the assistant's reply + the new message of turn t, so a prefix cache can hit.
After a turn's reply the conversation may fan out subagent groups: the children of a group run
in parallel and all of them finish before the parent's next turn is sent.

Token counts here are the trace's own (synthetic, recorded or tokenizer-measured); the benchmark
reports the server's counts next to them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


@dataclass(slots=True)
class Turn:
    """One request of a conversation."""

    new_tokens: int  # tokens of the message that opens this turn (tool result or user text)
    output_tokens: int  # forced completion length (ignore_eos + min_tokens)
    think_time_s: float = 0.0  # client-side delay before this request (after the previous reply/join)
    subagents: list[SubagentGroup] = field(default_factory=list)  # spawned after this reply
    user_text: str | None = None  # recorded message text; synthesised when None
    reply_text: str | None = None  # recorded assistant reply, sent back unless replies="live"
    reset: bool = False  # context was compacted: the conversation restarts from this message
    reuse_tokens: int | None = None  # recorded reusable prefix (WEKA hash ids); derived when None


@dataclass(slots=True)
class Conversation:
    conv_id: str
    turns: list[Turn]
    system_tokens: int = 0  # system/tool preamble before the first user message
    system_text: str | None = None
    inherits_parent: bool = False  # a child that continues its parent's context


@dataclass(slots=True)
class SubagentGroup:
    children: list[Conversation]


@dataclass(slots=True)
class SessionTrace:
    session_id: str
    root: Conversation


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a session with its trace-level input size and reusable prefix."""

    conv_id: str
    turn_index: int
    input_tokens: int
    output_tokens: int
    reuse_tokens: int
    is_subagent: bool


def stable_seed(*parts: object) -> int:
    """A process-independent 64-bit seed (Python's str hash is salted per process)."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def iter_requests(session: SessionTrace) -> Iterator[TraceRequest]:
    """All requests of a session, depth-first in dependency order.

    Reuse follows the AgentX convention: only earlier *prompts* count as reusable (a reply is new
    input to the next prompt), so turn t reuses turn t-1's input and an inheriting child's first
    turn reuses its parent's input at the spawn.
    """
    yield from _iter_conversation(session.root, context=0, parent_input=0, is_subagent=False)


def _iter_conversation(
    conv: Conversation, context: int, parent_input: int, is_subagent: bool
) -> Iterator[TraceRequest]:
    base = context if conv.inherits_parent else 0
    prev_input = parent_input if conv.inherits_parent else 0
    total = base + conv.system_tokens
    for index, turn in enumerate(conv.turns):
        if turn.reset:
            total, prev_input = conv.system_tokens, 0
        total += turn.new_tokens
        reuse = prev_input if turn.reuse_tokens is None else turn.reuse_tokens
        yield TraceRequest(conv.conv_id, index, total, turn.output_tokens, min(reuse, total), is_subagent)
        for group in turn.subagents:
            for child in group.children:
                yield from _iter_conversation(child, total + turn.output_tokens, total, True)
        prev_input = total
        total += turn.output_tokens


def iter_conversations(conv: Conversation) -> Iterator[Conversation]:
    yield conv
    for turn in conv.turns:
        for group in turn.subagents:
            for child in group.children:
                yield from iter_conversations(child)


@dataclass(frozen=True, slots=True)
class TraceStats:
    """Workload shape, comparable with the published AgentX dataset figures."""

    sessions: int
    requests: int
    turns_median: float  # root-conversation turns per session
    turns_min: int
    input_median: float
    input_p90: float
    input_p99: float
    input_max: int
    output_median: float
    output_p90: float
    reuse_token_weighted: float  # sum(reusable prefix) / sum(input)
    subagent_session_share: float
    subagent_groups_median: float  # per session that has subagents
    subagent_request_share: float

    def to_dict(self) -> dict[str, float | int]:
        return {name: getattr(self, name) for name in self.__slots__}


def trace_stats(sessions: Sequence[SessionTrace]) -> TraceStats:
    inputs: list[int] = []
    outputs: list[int] = []
    reuse = 0
    sub_requests = 0
    turns: list[int] = []
    groups: list[int] = []
    for session in sessions:
        turns.append(len(session.root.turns))
        n_groups = sum(len(t.subagents) for c in iter_conversations(session.root) for t in c.turns)
        if n_groups:
            groups.append(n_groups)
        for req in iter_requests(session):
            inputs.append(req.input_tokens)
            outputs.append(req.output_tokens)
            reuse += req.reuse_tokens
            sub_requests += req.is_subagent
    if not inputs:
        raise ValueError("trace_stats needs at least one request")
    ins, outs = np.asarray(inputs), np.asarray(outputs)
    return TraceStats(
        sessions=len(sessions),
        requests=len(inputs),
        turns_median=float(np.median(turns)),
        turns_min=int(min(turns)),
        input_median=float(np.median(ins)),
        input_p90=float(np.percentile(ins, 90)),
        input_p99=float(np.percentile(ins, 99)),
        input_max=int(ins.max()),
        output_median=float(np.median(outs)),
        output_p90=float(np.percentile(outs, 90)),
        reuse_token_weighted=float(reuse / ins.sum()),
        subagent_session_share=len(groups) / len(sessions),
        subagent_groups_median=float(np.median(groups)) if groups else 0.0,
        subagent_request_share=sub_requests / len(inputs),
    )


class TraceSource(Protocol):
    """Where lanes get sessions: `session(i)` for any i >= 0 (list sources cycle)."""

    name: str

    def session(self, index: int) -> SessionTrace: ...

    def sessions(self, count: int) -> list[SessionTrace]:
        """Up to `count` distinct sessions (for workload statistics)."""
        ...


class ListTraceSource:
    """A finite list of sessions, cycled when lanes need more than it holds."""

    def __init__(self, sessions: Sequence[SessionTrace], name: str) -> None:
        if not sessions or any(not s.root.turns for s in sessions):
            raise ValueError(f"{name}: every session needs at least one turn")
        self.sessions_list = list(sessions)
        self.name = name

    def __len__(self) -> int:
        return len(self.sessions_list)

    def session(self, index: int) -> SessionTrace:
        return self.sessions_list[index % len(self.sessions_list)]

    def sessions(self, count: int) -> list[SessionTrace]:
        return [self.session(i) for i in range(min(count, len(self.sessions_list)))]
