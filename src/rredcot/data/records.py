"""Prompts, reference pairs and the reward: how dataset rows become training and evaluation inputs.

Rows follow the common math schema (``id, problem, answer, solution, source, level``). The prompt
template and the exit/answer delimiters come from the config's ``prompt`` section, so the same code
serves the synthetic task and R1-style chat models.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rredcot.data.grading import grade, last_box


def format_prompt(template: str, problem: str) -> str:
    """Fill the prompt template (``{problem}`` placeholder) with a problem statement."""
    return template.replace("{problem}", problem)


def build_prompt(prompt_cfg: Mapping[str, Any] | str, problem: str, tokenizer: Any = None) -> str:
    """The generation prompt for one problem, following the config's ``prompt`` section.

    ``style: template`` fills ``template`` directly (the synthetic task's raw format). ``style: chat``
    makes the filled ``template`` the user message (after an optional ``system_prompt``) and renders it
    with the tokenizer's chat template, so real chat models see the format they were trained on. In
    both styles ``think_start`` is appended unless the prompt already ends with it: some chat
    templates open the thinking block themselves, others leave it to the model. A bare string is
    taken as a ``template``-style template.
    """
    if isinstance(prompt_cfg, str):
        return format_prompt(prompt_cfg, problem)
    user = format_prompt(prompt_cfg["template"], problem)
    if prompt_cfg["style"] == "chat":
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "prompt.style is 'chat' but the tokenizer has no chat template; "
                "use prompt.style: template or a tokenizer that defines one"
            )
        messages = []
        if prompt_cfg["system_prompt"]:
            messages.append({"role": "system", "content": prompt_cfg["system_prompt"]})
        messages.append({"role": "user", "content": user})
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    else:
        text = user
    think_start = prompt_cfg["think_start"]
    if think_start.strip() and not text.rstrip().endswith(think_start.strip()):
        text += think_start
    return text


def build_prompts(
    prompt_cfg: Mapping[str, Any] | str, problems: Sequence[str], tokenizer: Any = None
) -> list[str]:
    """:func:`build_prompt` for every problem."""
    return [build_prompt(prompt_cfg, p, tokenizer) for p in problems]


def reference_solution(solution: str | None) -> str | None:
    """The reasoning part of a dataset solution: the text before its final ``\\boxed{...}``.

    The answer itself is scored separately (``log p(y | u, s)``), so it is cut from ``u``. Trailing
    spaces are kept out because the answer prefix supplies its own.
    """
    if not solution or not solution.strip():
        return None
    box = last_box(solution)
    if box is None or box.end is None:
        return solution.rstrip()
    return solution[: box.start].rstrip()


def rl_records(
    rows: Sequence[Mapping[str, Any]], template: str | Mapping[str, Any], tokenizer: Any = None
) -> list[dict[str, Any]]:
    """Rows for TRL's GRPOTrainer: a ``prompt`` plus the columns the reward and credit need.

    ``template`` is a template string or the config's whole ``prompt`` section; with ``style: chat``
    the prompt is rendered with ``tokenizer``'s chat template, exactly as evaluation renders it.
    """
    return [
        {
            "prompt": build_prompt(template, row["problem"], tokenizer),
            "problem": str(row["problem"]),
            "answer": str(row["answer"]),
            "reference": reference_solution(row.get("solution")) or "",
            "level": int(row.get("level") or 0),
            "id": str(row["id"]),
        }
        for row in rows
    ]


def sft_records(
    rows: Sequence[Mapping[str, Any]], template: str | Mapping[str, Any], eos: str, tokenizer: Any = None
) -> list[dict[str, str]]:
    """Prompt/completion pairs for SFT warm-up (loss on the completion only). ``template`` is a
    template string or the config's whole ``prompt`` section: the prompt is what RL and evaluation
    generate from (:func:`build_prompt`; with ``style: chat`` rendered by ``tokenizer``'s chat
    template). A row's optional ``given`` text (the start of a trace up to an exit point) goes into
    the prompt, untrained."""
    return [
        {
            "prompt": build_prompt(template, row["problem"], tokenizer) + (row.get("given") or ""),
            "completion": row["completion"] + eos,
        }
        for row in rows
        if row.get("completion")
    ]


def correctness_reward(completions: list[str], answer: list[str], **_: Any) -> list[float]:
    """Verifiable reward: 1.0 when the completion's final boxed answer is equivalent to the label."""
    return [1.0 if grade(text, gold) else 0.0 for text, gold in zip(completions, answer, strict=True)]


def row_reward(row: Mapping[str, Any], completion: str) -> float:
    """``correctness_reward`` of one completion of one dataset row (the Monte Carlo arm's rollouts)."""
    return correctness_reward([completion], [str(row["answer"])])[0]
