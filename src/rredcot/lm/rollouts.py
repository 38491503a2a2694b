"""Grading a policy rollout that continues a trace prefix: the one rule shared by the Monte Carlo
study (:mod:`rredcot.studies.mc`) and the Monte Carlo credit arm (:mod:`rredcot.adapter.trainer`).

A rollout continues ``prompt ⊕ completion[:c]``: the model keeps thinking from there, then answers.
The text graded is ``completion[:c]`` plus the continuation, as evaluation grades a completion, and
``answer_token`` says after how many generated tokens the graded answer is complete (truncation
studies read a budget T < B from the same rollouts).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rredcot.data.grading import answers_equivalent, extract_boxed, final_part, last_box
from rredcot.lm.generation import Completion


def answer_end(text: str, exit_string: str | None) -> int | None:
    """Character index just past the closing brace of the answer that grading reads, or None.

    That answer is the last ``\\boxed{}`` after the exit string (:func:`rredcot.data.grading.extract_answer`);
    no box opens after it, so once its brace is written the graded answer can no longer change.
    """
    part = final_part(text, exit_string)
    box = last_box(part)
    if box is None or box.end is None:
        return None
    return len(text) - len(part) + box.end


def answer_token(
    prefix_text: str, token_ids: Sequence[int], decode: Callable[[list[int]], str], exit_string: str | None
) -> int | None:
    """Generated tokens after which the graded answer of ``prefix_text + decode(token_ids)`` is complete.

    0 when the answer already stands in the prefix; None when there is none. Binary search over the
    decoded length of the first t tokens (monotone in t), so a rollout costs O(log n) decodes.
    """
    end = answer_end(prefix_text + decode(list(token_ids)), exit_string)
    if end is None:
        return None
    need = end - len(prefix_text)
    if need <= 0:
        return 0
    lo, hi = 1, len(token_ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(decode(list(token_ids[:mid]))) >= need:
            hi = mid
        else:
            lo = mid + 1
    return lo


def rollout_record(
    prefix_text: str,
    rollout: Completion,
    gold: str,
    decode: Callable[[list[int]], str],
    exit_string: str | None,
    keep_text: bool = False,
) -> dict[str, Any]:
    """Grade one continuation and find where its answer is complete."""
    text = prefix_text + rollout.text
    end = answer_end(text, exit_string)
    answer = None if end is None else extract_boxed(final_part(text, exit_string))
    record = {
        "n_tokens": len(rollout.token_ids),
        "truncated": rollout.truncated,
        "answer": answer,
        "correct": answer is not None and answers_equivalent(gold, answer),
        "answer_token": None
        if end is None
        else answer_token(prefix_text, rollout.token_ids, decode, exit_string),
    }
    if keep_text:
        record["text"] = rollout.text
    return record
