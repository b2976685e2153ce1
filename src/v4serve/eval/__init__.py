"""Accuracy evals against a running server (GSM8K, GPQA-Diamond) and fidelity statistics.

`eval fidelity` (offline, engine-side) uses `divergence` for its numbers.
"""

from v4serve.eval.divergence import (
    DivergenceSummary,
    greedy_match,
    kl_divergence,
    kl_top_k,
    summarize,
    top1_agreement,
)
from v4serve.eval.extract import extract_choice, extract_number, numbers_equal
from v4serve.eval.gpqa import load_gpqa
from v4serve.eval.gsm8k import load_gsm8k
from v4serve.eval.runner import EvalConfig, EvalReport, ItemResult, accuracy_stderr, run_eval
from v4serve.eval.tasks import EvalItem, EvalTask

__all__ = [
    "DivergenceSummary",
    "EvalConfig",
    "EvalItem",
    "EvalReport",
    "EvalTask",
    "ItemResult",
    "accuracy_stderr",
    "extract_choice",
    "extract_number",
    "greedy_match",
    "kl_divergence",
    "kl_top_k",
    "load_gpqa",
    "load_gsm8k",
    "numbers_equal",
    "run_eval",
    "summarize",
    "top1_agreement",
]
