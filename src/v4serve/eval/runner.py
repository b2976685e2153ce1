"""Runs an eval task against an OpenAI-compatible server: concurrent chat requests, accuracy.

The standard error is that of a mean of 0/1 scores with the sample variance (as lm-eval reports):
sqrt(p (1 - p) / (n - 1)). A failed request scores 0 and is counted separately. The answer is
taken from the message content; when the content is empty (e.g. the model spent its budget in a
separate reasoning field) the reasoning text is graded instead and the item is flagged.
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx
from tqdm import tqdm

from v4serve.eval.tasks import EvalItem, EvalTask


@dataclass
class EvalConfig:
    base_url: str
    model: str | None = None
    concurrency: int = 16
    max_tokens: int = 4096
    temperature: float = 0.0
    extra_body: dict[str, Any] | None = None
    request_timeout_s: float = 1800.0
    progress: bool = True
    api_key: str | None = field(default=None, repr=False)  # sent as a Bearer token; never written to reports


@dataclass(slots=True)
class ItemResult:
    id: str
    expected: str
    answer: str | None
    correct: bool
    completion_tokens: int | None = None
    from_reasoning: bool = False
    error: str | None = None
    output_tail: str = ""


@dataclass
class EvalReport:
    task: str
    model: str
    base_url: str
    n: int
    correct: int
    accuracy: float
    stderr: float
    failed_requests: int
    no_answer: int
    wall_s: float
    items: list[ItemResult] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        return (
            f"{self.task}: accuracy {self.accuracy:.4f} ± {self.stderr:.4f} ({self.correct}/{self.n}); "
            f"failed requests {self.failed_requests}, no answer found {self.no_answer}; model {self.model}"
        )


def accuracy_stderr(correct: int, n: int) -> tuple[float, float]:
    if n == 0:
        return 0.0, 0.0
    p = correct / n
    return p, math.sqrt(p * (1 - p) / (n - 1)) if n > 1 else 0.0


async def run_eval(task: EvalTask, items: list[EvalItem], cfg: EvalConfig) -> EvalReport:
    from v4serve.bench.client import auth_headers, fetch_models, first_model, normalize_base_url

    base = normalize_base_url(cfg.base_url)
    start = time.perf_counter()
    semaphore = asyncio.Semaphore(max(1, cfg.concurrency))
    bar = tqdm(total=len(items), desc=task.name, unit="item", disable=not cfg.progress, file=sys.stderr)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(
        timeout=httpx.Timeout(cfg.request_timeout_s, connect=30.0), limits=limits,
        headers=auth_headers(cfg.api_key),
    ) as http:
        model = cfg.model or first_model(await fetch_models(http, base))

        async def one(item: EvalItem) -> ItemResult:
            async with semaphore:
                try:
                    return await _ask(http, f"{base}/v1/chat/completions", model, task, item, cfg)
                finally:
                    bar.update(1)

        results = await asyncio.gather(*(one(item) for item in items))
    bar.close()
    correct = sum(r.correct for r in results)
    accuracy, stderr = accuracy_stderr(correct, len(results))
    return EvalReport(
        task=task.name,
        model=model,
        base_url=cfg.base_url,
        n=len(results),
        correct=correct,
        accuracy=accuracy,
        stderr=stderr,
        failed_requests=sum(r.error is not None for r in results),
        no_answer=sum(r.error is None and r.answer is None for r in results),
        wall_s=time.perf_counter() - start,
        items=list(results),
    )


async def _ask(
    http: httpx.AsyncClient, url: str, model: str, task: EvalTask, item: EvalItem, cfg: EvalConfig
) -> ItemResult:
    payload = {
        "model": model,
        "messages": item.messages,
        "max_tokens": cfg.max_tokens,
        "temperature": cfg.temperature,
        **(cfg.extra_body or {}),
    }
    try:
        response = await http.post(url, json=payload)
        response.raise_for_status()
        body = response.json()
        message = body["choices"][0]["message"]
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
        return ItemResult(item.id, item.expected, None, False, error=f"{type(exc).__name__}: {exc}"[:300])
    content = message.get("content") or ""
    reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
    output = content if content.strip() else reasoning
    answer = task.extract(item, output)
    return ItemResult(
        id=item.id,
        expected=item.expected,
        answer=answer,
        correct=task.is_correct(item, answer),
        completion_tokens=(body.get("usage") or {}).get("completion_tokens"),
        from_reasoning=not content.strip() and bool(reasoning),
        output_tail=output[-300:],
    )
