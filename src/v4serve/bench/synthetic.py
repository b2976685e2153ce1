"""Synthetic agentic sessions shaped like the published AgentX (Claude-Code) dataset.

Targets at scale 1 (serving-techniques.md §3.2/3.4): >= 20 turns per session with a median of
~43; per-request input median ~142K tokens with a long tail towards 1M; output median ~444;
token-weighted prefix reuse >= 95%; subagent groups in ~44% of sessions (median 4 groups).

`scale` multiplies every token count (contexts and outputs) so that small models and CPU runs
keep the same shape: turn counts, reuse, subagent structure and think times are unchanged.
Sessions are generated independently from (seed, index), so any session can be rebuilt alone.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from v4serve.bench.traces import Conversation, SessionTrace, SubagentGroup, Turn, stable_seed


@dataclass(frozen=True)
class SyntheticTraceConfig:
    scale: float = 1.0
    output_scale: float | None = None  # defaults to `scale`
    seed: int = 0
    max_context: int | None = None  # tokens; default 1M x scale. A session ends before exceeding it.
    # Turns of the root conversation: min_turns + lognormal, so the median is ~43.
    min_turns: int = 20
    extra_turns_median: float = 23.0
    extra_turns_sigma: float = 1.0  # heavy tail: long sessions dominate the request count
    max_turns: int = 1000
    # First turn: a large system/tool preamble (salted per session by the runner) + a user message.
    system_tokens_median: float = 20_000
    first_user_tokens_median: float = 800
    # Per-turn appended message: mostly tool results of a few hundred to a few thousand tokens,
    # with occasional large pastes of tens of thousands.
    delta_tokens_median: float = 2_300
    delta_tokens_sigma: float = 1.2
    paste_probability: float = 0.03
    paste_tokens_median: float = 25_000
    output_tokens_median: float = 444
    output_tokens_sigma: float = 1.0
    max_output_tokens: int = 16_384
    # Think time (tool execution + user): heavy-tailed, median of seconds, capped per gap.
    think_time_median_s: float = 2.0
    think_time_sigma: float = 1.4
    think_time_cap_s: float = 300.0
    # Subagents.
    subagent_session_share: float = 0.44
    subagent_groups_median: float = 4.0
    children_per_group_mean: float = 1.5  # 1 + Poisson(mean - 1), capped at 10 (AgentX selection)
    child_turns_median: float = 4.0
    child_inherit_probability: float = 0.25  # otherwise a fresh context with its own preamble
    child_system_tokens_median: float = 9_000

    @property
    def context_limit(self) -> int:
        return self.max_context if self.max_context is not None else max(64, int(1_000_000 * self.scale))


class SyntheticTraceSource:
    """Deterministic, unbounded source of synthetic sessions: `session(i)` depends on (seed, i)."""

    name = "synthetic"

    def __init__(self, config: SyntheticTraceConfig) -> None:
        self.config = config
        self._out_scale = config.scale if config.output_scale is None else config.output_scale

    def __len__(self) -> int:  # unbounded; the runner cycles by index
        return 1 << 30

    def sessions(self, count: int) -> list[SessionTrace]:
        return [self.session(i) for i in range(count)]

    def session(self, index: int) -> SessionTrace:
        cfg = self.config
        rng = random.Random(stable_seed("synthetic", cfg.seed, index))
        sid = f"syn-{cfg.seed}-{index}"
        n_turns = min(
            cfg.max_turns,
            cfg.min_turns + round(_lognormal(rng, cfg.extra_turns_median, cfg.extra_turns_sigma)),
        )
        root = self._conversation(
            rng, f"{sid}/root", n_turns, self._tokens(rng, cfg.system_tokens_median, 0.3), start_context=0
        )
        if rng.random() < cfg.subagent_session_share and len(root.turns) > 1:
            self._attach_subagents(rng, root)
        return SessionTrace(session_id=sid, root=root)

    # -- building blocks -------------------------------------------------------------------

    def _conversation(
        self, rng: random.Random, conv_id: str, n_turns: int, system_tokens: int, start_context: int
    ) -> Conversation:
        cfg = self.config
        limit = cfg.context_limit
        turns: list[Turn] = []
        context = start_context + system_tokens
        for t in range(n_turns):
            if t == 0:
                new = self._tokens(rng, cfg.first_user_tokens_median, 0.8)
            elif rng.random() < cfg.paste_probability:
                new = self._tokens(rng, cfg.paste_tokens_median, 0.6)
            else:
                new = self._tokens(rng, cfg.delta_tokens_median, cfg.delta_tokens_sigma)
            out = min(
                cfg.max_output_tokens,
                self._tokens(rng, cfg.output_tokens_median, cfg.output_tokens_sigma, self._out_scale),
            )
            if context + new + out > limit:
                if t == 0:  # keep at least one request that fits
                    new = max(1, limit - context - out)
                else:
                    break
            think = (
                0.0
                if t == 0
                else min(cfg.think_time_cap_s, _lognormal(rng, cfg.think_time_median_s, cfg.think_time_sigma))
            )
            turns.append(Turn(new_tokens=new, output_tokens=out, think_time_s=think))
            context += new + out
        return Conversation(conv_id=conv_id, turns=turns, system_tokens=system_tokens)

    def _attach_subagents(self, rng: random.Random, root: Conversation) -> None:
        cfg = self.config
        n_groups = max(1, round(_lognormal(rng, cfg.subagent_groups_median, 0.7)))
        # A group hangs off a parent turn that has a following turn, so the join gates something.
        anchors = sorted(rng.sample(range(len(root.turns) - 1), min(n_groups, len(root.turns) - 1)))
        contexts = _contexts_after_reply(root)
        for g, anchor in enumerate(anchors):
            n_children = min(10, 1 + _poisson(rng, cfg.children_per_group_mean - 1.0))
            children = []
            for c in range(n_children):
                inherit = rng.random() < cfg.child_inherit_probability
                system = 0 if inherit else self._tokens(rng, cfg.child_system_tokens_median, 0.3)
                start = contexts[anchor] if inherit else 0
                n_turns = max(1, round(_lognormal(rng, cfg.child_turns_median, 0.8)))
                child = self._conversation(rng, f"{root.conv_id}/g{g}c{c}", n_turns, system, start)
                child.inherits_parent = inherit
                if child.turns:
                    children.append(child)
            if children:
                root.turns[anchor].subagents.append(SubagentGroup(children))

    def _tokens(self, rng: random.Random, median: float, sigma: float, scale: float | None = None) -> int:
        scale = self.config.scale if scale is None else scale
        return max(1, round(_lognormal(rng, median, sigma) * scale))


def _contexts_after_reply(conv: Conversation) -> list[int]:
    """Context size of `conv` after each turn's reply (what an inheriting child starts from)."""
    out, total = [], conv.system_tokens
    for turn in conv.turns:
        total += turn.new_tokens + turn.output_tokens
        out.append(total)
    return out


def _lognormal(rng: random.Random, median: float, sigma: float) -> float:
    return median * math.exp(rng.gauss(0.0, sigma))


def _poisson(rng: random.Random, mean: float) -> int:
    if mean <= 0:
        return 0
    limit, k, p = math.exp(-mean), 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k
