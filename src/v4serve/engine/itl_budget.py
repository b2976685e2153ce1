"""How many prefill tokens may share a step with decode rows, so that running requests keep their inter-token latency.

A prefill chunk in the same step as decodes makes every decoding request wait for it: at 16 agent sessions, 2K-token
chunks beside decodes took p90 interactivity to 6 tokens/s in the AgentX-style run. Two engine flags bound it:

* `--prefill-budget-with-decodes N`: at most N prefill tokens in a step that has decode rows (a fixed cap);
* `--target-itl-ms T`: the cap follows a latency target. The engine reports each step's wall time with its decode rows
  and prefill tokens; this keeps running averages of the decode-only step time d and of the extra time per prefill token
  c, and allows (T - d) / c prefill tokens (at least one block, so prefills always progress).

Steps without decode rows are not capped (nobody waits on them). The trade-off: a lower cap keeps decodes fast but
spreads a new prompt over more steps (a longer time to first token under load).

A cap bounds how slow a step with prefill gets, not how many steps are slow. In agentic traffic each turn brings a
few hundred new tokens and generates a few dozen: with 16 sessions a new turn arrives every few decode steps, so most
steps carry some prefill, and an eager prefill step costs tens of ms whatever its size (fourteenth session, H200,
v4-flash-l8-e16: p90 inter-token latency 42 ms at 16 sessions with `--target-itl-ms 6`, p50 3.3 ms). `PrefillGate`
(`--decode-steps-between-prefills N`) therefore lets prefill join decode rows only every N + 1 steps, so the turns
that arrived meanwhile share one step; `--max-prefill-delay-ms` bounds the wait (a prefill older than that goes in the
next step), so it costs each new turn at most that much time to first token.
"""

from __future__ import annotations

ALPHA = 0.2  # weight of the newest observation in the running averages
# The gate's default where decode steps are CUDA graphs (a mixed step is eager, several times a graphed step): the
# p90 of inter-token latency stays on decode steps while fewer than 10% of the steps carry prefill. H200, eighteenth
# session, AgentX-style run at 16 sessions (v4-flash-l8-e16): gate 8 p90 interactivity 48, 12 -> 70-79, 16 -> 147,
# 20 -> 159 and 175 (two runs), TPGS 107K -> 118K; at 4 sessions 20 costs TTFT p90 0.16 -> 0.20 s.
AUTO_GATE_STEPS = 20


def gate_steps(configured: int | None, graphed: bool) -> int:
    """`--decode-steps-between-prefills`: as configured, or (None) AUTO_GATE_STEPS with decode graphs, else off."""
    if configured is not None:
        return configured
    return AUTO_GATE_STEPS if graphed else 0


class PrefillBudget:
    def __init__(self, fixed: int = 0, target_itl_ms: float = 0.0, minimum: int = 1):
        self.fixed = fixed
        self.target = target_itl_ms / 1e3
        self.minimum = max(1, minimum)
        self.decode_s: float | None = None  # step time with decode rows only
        self.per_token_s: float | None = None  # extra step time per prefill token beside decodes

    @property
    def active(self) -> bool:
        return self.fixed > 0 or self.target > 0

    def reset(self) -> None:
        """Forget the step times seen so far (the warm-up's were inflated by compiles)."""
        self.decode_s = self.per_token_s = None

    def observe(self, decode_rows: int, prefill_tokens: int, seconds: float) -> None:
        if not self.target or decode_rows == 0:
            return
        if prefill_tokens == 0:
            self.decode_s = seconds if self.decode_s is None else (1 - ALPHA) * self.decode_s + ALPHA * seconds
        elif self.decode_s is not None:
            c = max(seconds - self.decode_s, 0.0) / prefill_tokens
            self.per_token_s = c if self.per_token_s is None else (1 - ALPHA) * self.per_token_s + ALPHA * c

    def tokens(self) -> int | None:
        """The cap on prefill tokens in a step with decode rows (None = no cap)."""
        caps = []
        if self.fixed > 0:
            caps.append(self.fixed)
        if self.target > 0 and self.decode_s is not None and self.per_token_s:
            caps.append(int(max(self.target - self.decode_s, 0.0) / self.per_token_s))
        if not caps:
            return None
        return max(self.minimum, min(caps))


class PrefillGate:
    """Whether prefill work may join a step that has decode rows: after `every` decode-only steps, or once the oldest
    pending prefill has waited `max_delay_ms` (0 = no bound). `every` = 0: always (the gate is off)."""

    def __init__(self, every: int = 0, max_delay_ms: float = 0.0):
        self.every = every
        self.max_delay = max_delay_ms / 1e3
        self.decode_only_steps = 0  # since the last step that carried prefill

    @property
    def active(self) -> bool:
        return self.every > 0

    def open(self, now: float, pending_since: float | None) -> bool:
        if not self.active or pending_since is None or self.decode_only_steps >= self.every:
            return True
        return self.max_delay > 0 and now - pending_since >= self.max_delay

    def reset(self) -> None:
        self.decode_only_steps = 0

    def note(self, decode_rows: int, prefill_tokens: int) -> None:
        """A scheduled step's shape."""
        if prefill_tokens:
            self.decode_only_steps = 0
        elif decode_rows:
            self.decode_only_steps += 1
