"""Replays one session tree against the server as one closed-loop client.

Each request's messages are an exact textual extension of the previous request's in the same
conversation: previous messages + the assistant reply (the server's actual text, or the recorded
reply of a real trace, unless replies="live") + the next tool-result/user message. The first message
of a session starts with a unique salt, so sessions never share cache with each other while each
keeps its own reuse. Subagent groups fan out after their anchor turn and join before the next.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from v4serve.bench.client import StreamResult, chat_payload, stream_request
from v4serve.bench.metrics import RequestRecord
from v4serve.bench.pacing import Pacer, PointGate, WindowClosed
from v4serve.bench.text import TokenText
from v4serve.bench.traces import Conversation, SessionTrace, Turn

Message = dict[str, str]


@dataclass
class ReplayOptions:
    model: str
    chat_url: str
    think_time_scale: float = 1.0
    max_think_time_s: float = 300.0
    replies: str = (
        "auto"  # "auto": the trace's recorded reply when it has one, else live; "live": always live
    )
    send_cache_salt: bool = False  # also send the salt as the vLLM-style `cache_salt` field
    extra_body: dict[str, Any] | None = None
    failure_backoff_s: float = 0.5


@dataclass
class LaneContext:
    """What all lanes of one concurrency point share."""

    http: httpx.AsyncClient
    options: ReplayOptions
    gate: PointGate
    pacer: Pacer
    text: TokenText
    t0: float  # perf_counter at the start of the point
    records: list[RequestRecord] = field(default_factory=list)


@dataclass
class _Chain:
    """State of one conversation being replayed."""

    conv: Conversation
    messages: list[Message]
    salt: str
    last_prompt_tokens: int = 0  # theoretical reusable prefix for the next request


class SessionRunner:
    def __init__(self, lane: int, ctx: LaneContext) -> None:
        self.lane = lane
        self.ctx = ctx
        self._session_id = ""

    async def run(self, session: SessionTrace, salt: str, start_turn: int = 0) -> None:
        """Replay `session`; with start_turn > 0, prime its prefix first (max_tokens=1)."""
        self._session_id = session.session_id
        root = session.root
        chain = _Chain(root, self._opening(root, salt, self._user_text(root, 0)), salt)
        if start_turn > 0:
            for t in range(1, start_turn + 1):
                prev = root.turns[t - 1]
                self._extend(chain, t, prev.reply_text or self._synthetic_reply(chain, t - 1))
            res = await self._send(chain, start_turn, max_tokens=1, prime=True)
            if not res.ok:
                return
        await self._run_turns(chain, start_turn)

    # -- conversation loop -----------------------------------------------------------------

    async def _run_turns(self, chain: _Chain, first: int) -> None:
        turns = chain.conv.turns
        reply = ""
        for t in range(first, len(turns)):
            turn = turns[t]
            if t > first:
                await self.ctx.pacer.sleep(self._think(turn))
                self._extend(chain, t, reply)
            res = await self._send(chain, t, max_tokens=turn.output_tokens)
            if not res.ok:
                await self.ctx.pacer.sleep(self.ctx.options.failure_backoff_s)
                return  # a failed turn ends this conversation; the lane moves on
            reply = self._reply_text(turn, res)
            for group in turn.subagents:
                await self._fan_out(chain, reply, group.children)
                if self.ctx.gate.closed:
                    raise WindowClosed

    async def _fan_out(self, parent: _Chain, reply: str, children: list[Conversation]) -> None:
        async def run_child(child: Conversation) -> None:
            if child.inherits_parent:
                messages = parent.messages + [{"role": "assistant", "content": reply}]
                messages.append({"role": "user", "content": self._user_text(child, 0)})
                chain = _Chain(child, messages, parent.salt, parent.last_prompt_tokens)
            else:
                salt = f"{parent.salt}.{child.conv_id.rsplit('/', 1)[-1]}"
                chain = _Chain(child, self._opening(child, salt, self._user_text(child, 0)), salt)
            try:
                await self._run_turns(chain, 0)
            except WindowClosed:
                pass  # the parent notices the closed gate after the join

        await asyncio.gather(*(run_child(c) for c in children))

    # -- requests --------------------------------------------------------------------------

    async def _send(self, chain: _Chain, t: int, max_tokens: int, prime: bool = False) -> StreamResult:
        ctx, opts = self.ctx, self.ctx.options
        phase = await ctx.gate.admit(self.lane, prime=prime)
        extra = dict(opts.extra_body or {})
        if opts.send_cache_salt:
            extra["cache_salt"] = chain.salt.split(".", 1)[0]
        payload = chat_payload(
            opts.model, chain.messages, max_tokens, force_length=not prime, extra_body=extra
        )
        start = time.perf_counter() - ctx.t0
        ctx.pacer.started()
        try:
            res = await stream_request(ctx.http, opts.chat_url, payload)
        finally:
            ctx.pacer.finished()
        ctx.records.append(
            RequestRecord(
                lane=self.lane,
                session_id=self._session_id,
                conv_id=chain.conv.conv_id,
                turn=t,
                phase=phase,
                start_s=start,
                ok=res.ok,
                error=res.error,
                ttft_s=res.ttft_s,
                e2el_s=res.e2el_s,
                itl_s=res.itl_s,
                prompt_tokens=res.prompt_tokens or 0,
                completion_tokens=res.completion_tokens or 0,
                cached_tokens=res.cached_tokens,
                expected_output_tokens=max_tokens,
                reusable_tokens=min(chain.last_prompt_tokens, res.prompt_tokens or 0),
            )
        )
        chain.last_prompt_tokens = (res.prompt_tokens or 0) if res.ok else 0
        return res

    # -- message construction --------------------------------------------------------------

    def _opening(self, conv: Conversation, salt: str, first_user: str) -> list[Message]:
        """System preamble (if any) + first user message, with the session salt in front."""
        marker = f"[session {salt}]"
        if conv.system_text is not None or conv.system_tokens > 0:
            system = conv.system_text or self.ctx.text.generate(conv.system_tokens, conv.conv_id, "system")
            return [
                {"role": "system", "content": f"{marker}\n{system}"},
                {"role": "user", "content": first_user},
            ]
        return [{"role": "user", "content": f"{marker}\n{first_user}"}]

    def _extend(self, chain: _Chain, t: int, reply: str) -> None:
        turn = chain.conv.turns[t]
        if turn.reset:  # compacted context: start over from the (salted) preamble
            chain.messages = self._opening(chain.conv, chain.salt, self._user_text(chain.conv, t))
            chain.last_prompt_tokens = 0
            return
        chain.messages = chain.messages + [
            {"role": "assistant", "content": reply},
            {"role": "user", "content": self._user_text(chain.conv, t)},
        ]

    def _user_text(self, conv: Conversation, t: int) -> str:
        turn = conv.turns[t]
        if turn.user_text is not None:
            return turn.user_text
        return self.ctx.text.generate(turn.new_tokens, conv.conv_id, t, "user")

    def _synthetic_reply(self, chain: _Chain, t: int) -> str:
        return self.ctx.text.generate(chain.conv.turns[t].output_tokens, chain.conv.conv_id, t, "reply")

    def _reply_text(self, turn: Turn, res: StreamResult) -> str:
        if self.ctx.options.replies != "live" and turn.reply_text is not None:
            return turn.reply_text
        return res.text

    def _think(self, turn: Turn) -> float:
        opts = self.ctx.options
        return min(opts.max_think_time_s, turn.think_time_s) * opts.think_time_scale
