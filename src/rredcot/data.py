"""Prompts, reference pairs and the reward: how dataset rows become training and evaluation inputs.

Rows follow the common math schema (``id, problem, answer, solution, source, level``). The prompt
template and the exit/answer delimiters come from the config's ``prompt`` section, so the same code
serves the synthetic task and R1-style chat models.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rredcot.grading import extract_boxed, grade


def format_prompt(template: str, problem: str) -> str:
    """Fill the prompt template (``{problem}`` placeholder) with a problem statement."""
    return template.replace("{problem}", problem)


def reference_solution(solution: str | None) -> str | None:
    """The reasoning part of a dataset solution: the text before its final ``\\boxed{...}``.

    The answer itself is scored separately (``log p(y | u, s)``), so it is cut from ``u``. Trailing
    spaces are kept out because the answer prefix supplies its own.
    """
    if not solution or not solution.strip():
        return None
    boxed = extract_boxed(solution)
    if boxed is None:
        return solution.rstrip()
    for marker in ("\\boxed{", "\\fbox{"):
        cut = solution.rfind(marker)
        if cut >= 0:
            return solution[:cut].rstrip()
    return solution.rstrip()


def rl_records(
    rows: Sequence[Mapping[str, Any]], template: str | Mapping[str, Any], tokenizer: Any = None
) -> list[dict[str, Any]]:
    """Rows for TRL's GRPOTrainer: a ``prompt`` plus the columns the reward and credit need.

    ``template`` is a template string or the config's whole ``prompt`` section; with ``style: chat``
    the prompt is rendered with ``tokenizer``'s chat template, exactly as evaluation renders it.
    """
    from rredcot.generation import build_prompt

    return [
        {
            "prompt": build_prompt(template, row["problem"], tokenizer),
            "answer": str(row["answer"]),
            "reference": reference_solution(row.get("solution")) or "",
            "level": int(row.get("level") or 0),
            "id": str(row["id"]),
        }
        for row in rows
    ]


def sft_records(rows: Sequence[Mapping[str, Any]], template: str, eos: str) -> list[dict[str, str]]:
    """Prompt/completion pairs for SFT warm-up (loss on the completion only)."""
    return [
        {"prompt": format_prompt(template, row["problem"]), "completion": row["completion"] + eos}
        for row in rows
        if row.get("completion")
    ]


def correctness_reward(completions: list[str], answer: list[str], **_: Any) -> list[float]:
    """Verifiable reward: 1.0 when the completion's final boxed answer is equivalent to the label."""
    return [1.0 if grade(text, gold) else 0.0 for text, gold in zip(completions, answer, strict=True)]
