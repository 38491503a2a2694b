"""Policy rollouts that continue a trace prefix: sampling them for the Monte Carlo credit arm
(:class:`PolicyRollouts`) and grading them, the one rule shared by the Monte Carlo study
(:mod:`rredcot.studies.mc`) and that arm.

A rollout continues ``prompt ⊕ completion[:c]``: the model keeps thinking from there, then answers.
The text graded is ``completion[:c]`` plus the continuation, as evaluation grades a completion, and
``answer_token`` says after how many generated tokens the graded answer is complete (truncation
studies read a budget T < B from the same rollouts).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

from rredcot.data.grading import answers_equivalent, extract_boxed, final_part, last_box
from rredcot.lm.generation import Completion, Generator, HFGenerator, VLLMGenerator, sample_seed
from rredcot.method.registry import TraceInput


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


class PolicyRollouts:
    """``samples`` rollouts from every exit point, scored by ``reward``; the sums per trace and cut.

    Identical prefixes share their rollouts: every trace of a group has the same prompt (cut 0), and
    sampled traces often share their first lines. Each trace still gets ``samples`` rollouts from each
    of its exit points, drawn from the same distribution; only the generation is not repeated. A
    shared prefix's rollouts are judged once per distinct ``groups[j]`` (traces of one dataset row
    share a group; a duplicated problem may carry another label). The rollout of prefix ``p``,
    sample ``m`` draws from the stream ``sample_seed(*seed, j, k, m)`` of the first trace ``j`` and
    cut ``k`` that holds ``p``. After a call, ``rollouts`` and ``tokens`` count what it generated.
    ``engine``: a vLLM engine in this process holding the policy's weights (a run's colocated engine),
    which then samples the rollouts instead of transformers.
    """

    def __init__(
        self,
        tokenizer: Any,
        reward: Callable[[int, str], float],
        groups: Sequence[Hashable],
        *,
        samples: int,
        batch_size: int,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        seed: tuple[int, ...],
        engine: Any = None,
    ) -> None:
        self.tokenizer, self.reward, self.groups = tokenizer, reward, list(groups)
        self.engine = engine
        self.samples, self.batch_size, self.max_new_tokens = samples, batch_size, max_new_tokens
        self.temperature, self.top_p, self.seed = temperature, top_p, seed
        self.rollouts = self.tokens = 0

    def __call__(
        self, policy: torch.nn.Module, items: list[TraceInput], cuts: list[list[int]]
    ) -> list[list[float]]:
        if len(items) != len(self.groups):
            raise ValueError(f"{len(items)} traces but {len(self.groups)} reward groups")
        first: dict[tuple[int, ...], int] = {}  # prefix -> index among the distinct prefixes
        where: list[list[int]] = []
        prefixes, seeds = [], []
        for j, (item, trace_cuts) in enumerate(zip(items, cuts, strict=True)):
            where.append([])
            for k, c in enumerate(trace_cuts):
                prefix = tuple(item.prompt_ids + item.completion_ids[:c])
                if prefix not in first:
                    first[prefix] = len(first)
                    prefixes += [list(prefix)] * self.samples
                    seeds += [sample_seed(*self.seed, j, k, m) for m in range(self.samples)]
                where[j].append(first[prefix])
        if self.engine is not None:
            sampler: Generator = VLLMGenerator(None, self.tokenizer, llm=self.engine)
        else:
            sampler = HFGenerator(policy, self.tokenizer, batch_size=self.batch_size)
        outs = sampler.sample(
            prefixes,
            seeds,
            temperature=self.temperature,
            top_p=self.top_p,
            max_new_tokens=self.max_new_tokens,
        )
        self.rollouts, self.tokens = len(outs), sum(len(o.token_ids) for o in outs)
        judged: dict[tuple[int, Hashable], float] = {}
        sums = []
        for j, (item, trace_cuts, slots) in enumerate(zip(items, cuts, where, strict=True)):
            trace_sums = []
            for c, slot in zip(trace_cuts, slots, strict=True):
                if (slot, self.groups[j]) not in judged:
                    head = self.tokenizer.decode(item.completion_ids[:c], skip_special_tokens=True)
                    batch = outs[slot * self.samples : (slot + 1) * self.samples]
                    judged[slot, self.groups[j]] = sum(self._reward(j, head + o.text) for o in batch)
                trace_sums.append(judged[slot, self.groups[j]])
            sums.append(trace_sums)
        return sums

    def _reward(self, j: int, text: str) -> float:
        value = float(self.reward(j, text))
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"a rollout's reward must lie in [0, 1], got {value}")
        return value
