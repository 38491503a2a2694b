"""RREDCoT's reward source: teacher-forced exit-point values (docs/method.md, "From a trace to σ").

At every exit point the value model reads ``prompt ⊕ completion[:cut] ⊕ exit ⊕ u ⊕ answer_prefix ⊕
y ⊕ answer_suffix`` for the reference pairs (u, y) and the PR-style estimate turns the
log-probabilities into a value; a thinking segment earns the change of value across it
(``value_space``). The answer segment after the model's own exit is judged against a baseline
solution read at the same exit (``answer_baseline``): the greedy one the model would write there
(``rredcot.method.answer_baseline``) or the reference one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from rredcot.method import credit as C
from rredcot.method import segmentation as S
from rredcot.method.answer_baseline import (
    engine_answer_log_probs,
    greedy_answer_log_probs,
    written_solution,
)
from rredcot.method.registry import (
    Batch,
    CreditMethod,
    SegmentRewards,
    TraceInput,
    register_credit_method,
    register_reward_source,
)
from rredcot.method.scoring.naive import score_traces_naive
from rredcot.method.scoring.single_pass import score_traces_single_pass, supports_single_pass
from rredcot.method.scoring.types import TraceExits, TraceScores

_log = logging.getLogger(__name__)


@register_reward_source(
    "exit_values",
    reads=("group_pairs", "proposal", "value_model", "scorer", "answer_baseline", "value_space"),
    needs=("reference_pairs",),
)
def exit_values(assigner, batch: Batch) -> list[SegmentRewards]:  # noqa: ANN001
    """Segment rewards from the value model's teacher-forced values at every exit point.

    With the policy as value model, entropies and segmentation come from the scoring's own trace
    pass (``cuts_for``); with a frozen value model the policy's entropies cut the traces first."""
    cfg, items, texts, ends = assigner.cfg, batch.items, batch.texts, batch.ends
    specs = [
        TraceExits(
            t.prompt_ids,
            t.completion_ids,
            None,
            [(assigner.encode(u) if u else [], assigner.encode(y)) for u, y in t.pairs],
            own_answer_cut(assigner, t.completion_ids, texts[j], ends[j]),
        )
        for j, t in enumerate(items)
    ]
    value_model = batch.value_model

    def cuts_for(j: int, entropies: torch.Tensor) -> list[int]:
        return assigner.segment(batch, j, entropies)

    if value_model is not batch.policy:
        entropies = assigner.entropies(batch)
        specs = [
            TraceExits(s.prompt_ids, s.completion_ids, cuts_for(j, entropies[j]), s.pairs, s.answer_cut)
            for j, s in enumerate(specs)
        ]
    with assigner.timed("scoring"):
        score = score_traces_single_pass if single_pass(assigner, value_model) else score_traces_naive
        scores = score(value_model, specs, assigner.strings(), cfg.budget, cuts_for)
    if batch.entropies is not None:  # the policy's, not the frozen value model's
        scores = [
            TraceScores(sc.cuts, sc.log_p_solution, sc.log_p_answer, h, sc.log_p_own_answer, sc.greedy_ids)
            for sc, h in zip(scores, batch.entropies, strict=True)
        ]
    baselines: list[_Baseline | None] = [None] * len(items)
    if cfg.answer_baseline == "greedy":
        with assigner.timed("answer_baseline"):
            baselines = greedy_baselines(assigner, value_model, batch, specs, scores)
    return [
        _segment_rewards(cfg, items[j], batch.starts[j], ends[j], sc, baselines[j])
        for j, sc in enumerate(scores)
    ]


def single_pass(assigner, model: torch.nn.Module) -> bool:  # noqa: ANN001
    """Whether to score with the single-pass scorer: configured, and the model supports it.

    A model whose cache cannot be cut at an exit point (sliding-window, linear-attention or
    state-space layers) or whose attention ignores 4D masks is scored naively, said once."""
    if assigner.cfg.scorer != "single_pass":
        return False
    if supports_single_pass(model):
        return True
    impl = getattr(model.config, "_attn_implementation", None)
    assigner.warn_once(
        f"single-pass scoring needs eager or sdpa attention and a plain key/value cache in every layer; "
        f"{type(model).__name__} (attention {impl!r}) has neither or not both, so its exit points are "
        "scored naively (one sequence per exit point: same values, about K/2 times the tokens)"
    )
    return False


def own_answer_cut(assigner, completion: list[int], texts: list[str], end: int | None) -> int | None:  # noqa: ANN001
    """Where the model's own final solution ends: its last answer prefix after the exit, else the end
    of the trace before its EOS. None when the model never exits (no answer segment)."""
    if end is None or end >= len(completion):
        return None
    prefix = assigner.cfg.answer_prefix
    needle = prefix.strip() or prefix
    box = S.find_text(texts, needle, start=end, last=True) if needle else None
    if box is not None:
        return box
    eos = assigner.tok.eos_token_id
    return len(completion) - 1 if completion[-1] == eos else len(completion)


@dataclass(frozen=True)
class _Baseline:
    """The greedy final solution at a trace's exit and how well it leads to the reference answer."""

    log_p_answer: float  # log p(y_ref | greedy solution, s_e)
    solution: list[int]
    is_own: bool  # the trace's own final solution is exactly this one


def greedy_baselines(
    assigner,  # noqa: ANN001
    model: torch.nn.Module,
    batch: Batch,
    specs: list[TraceExits],
    scores: list[TraceScores],
) -> list[_Baseline | None]:
    """Per trace with an answer segment: its greedy final solution and log p(y_ref | it, s_e).

    The solution starts after the token holding the end of the model's own exit string. The scoring
    pass already knows the model's most likely token at every completion position, so as long as the
    trace follows it, greedy decoding would write the trace's own tokens: a trace whose whole final
    solution (up to its answer prefix) does so is faithful and needs no decoding. The others decode
    from their first departure, with the trace's continuation as the draft; identical heads with the
    same answer decode once.
    """
    cfg, items, texts, ends = assigner.cfg, batch.items, batch.texts, batch.ends
    needle = cfg.answer_prefix.strip()
    eos = assigner.tok.eos_token_id

    def stop_at(solution: list[int]) -> int | None:
        # Asked after every token the solution grows by (answer_baseline._write): only the tokens
        # the needle can span back from the last one are read.
        first, reach = len(solution) - 1, len(needle) - 1
        while first > 0 and reach > 0:
            first -= 1
            reach -= len(assigner.token_text(solution[first]))
        found = S.find_text_at_end(assigner.token_texts(solution[first:]), needle)
        return None if found is None else first + found

    starts = {
        j: _exit_end(texts[j], ends[j], cfg.exit_string.strip())
        for j, spec in enumerate(specs)
        if ends[j] is not None and spec.answer_cut is not None
    }
    out: list[_Baseline | None] = [None] * len(items)
    if not starts:
        return out
    # Room for a solution twice the longest own one: a greedy solution that has not ended by then
    # is cut there and the answer forced after it.
    max_new = 2 * max(max(specs[j].answer_cut - start for j, start in starts.items()), 1) + 8
    jobs: dict[tuple[tuple[int, ...], tuple[int, ...], int], list[int]] = {}
    drafts: dict[tuple, list[int]] = {}
    owns = {j: items[j].completion_ids[start : specs[j].answer_cut] for j, start in starts.items()}
    for j, start in starts.items():
        completion, greedy, own = items[j].completion_ids, scores[j].greedy_ids, owns[j]
        agree = start
        while agree < len(completion) and int(greedy[agree]) == completion[agree]:
            agree += 1
        written = written_solution(completion[start:agree], stop_at, {eos}, max_new)
        if written == own:
            out[j] = _Baseline(float(scores[j].log_p_own_answer), own, True)
            continue
        # Decode from the first departure; if greedy decoding would already have ended before it
        # (rare: an earlier answer prefix or EOS), from the start of the solution.
        resume = agree if written is None else start
        head = (*items[j].prompt_ids, *completion[:resume])
        key = (head, tuple(specs[j].pairs[0][1]), len(items[j].prompt_ids) + start)
        jobs.setdefault(key, []).append(j)
        # Greedy decoding replaces the token at the departure and often writes on as the trace did:
        # the trace's continuation is the draft the decoder checks.
        drafts.setdefault(key, completion[resume + 1 :])
    if not jobs:
        return out
    keys = list(jobs)
    common = {
        "heads": [list(k[0]) for k in keys],
        "answers": [list(k[1]) for k in keys],
        "answer_prefix_ids": assigner.encode(cfg.answer_prefix),
        "answer_suffix_ids": assigner.encode(cfg.answer_suffix),
        "stop_at": stop_at,
        "eos_ids": [eos],
        "max_new_tokens": max_new,
        "solution_starts": [k[2] for k in keys],
        "budget": cfg.budget,
    }
    if batch.decoder is not None and model is batch.policy:
        # The run's inference engine holds the policy's weights and has the traces in its prefix
        # cache: it writes the solutions at generation speed, the model scores the answers.
        log_p, solutions = engine_answer_log_probs(
            model, batch.decoder, stop_text=needle or cfg.answer_prefix, **common
        )
    else:
        log_p, solutions = greedy_answer_log_probs(model, drafts=[drafts[k] for k in keys], **common)
    for k, lp, solution in zip(keys, log_p.tolist(), solutions, strict=True):
        for j in jobs[k]:
            out[j] = _Baseline(lp, solution, owns[j] == solution)
    return out


def _segment_rewards(
    cfg,  # noqa: ANN001
    item: TraceInput,
    starts: list[int],
    answer_at: int | None,
    scores: TraceScores,
    baseline: _Baseline | None,
) -> SegmentRewards:
    log_v = C.exit_log_values(scores.log_p_solution, scores.log_p_answer, item.log_q, item.utility)
    answer_reward = None
    if answer_at is not None and answer_at < len(item.completion_ids):
        # The answer segment's reward compares how well the model's own final solution and a
        # baseline solution, both read at the model's exit, lead to the reference answer:
        # r̂ = log p(y | own solution, s_e) - log p(y | baseline, s_e). Both are answer NLLs, so no
        # solution's (large) likelihood leaks into it. With the greedy baseline a faithful solution
        # (the one the model expects to write there) gets 0 and a slip the blame; with the reference
        # solution a faithful copy of a wrong thought is blamed too.
        starts = [*starts, answer_at]
        if baseline is None:
            answer_reward = float(scores.log_p_own_answer - scores.log_p_answer[-1, 0])
        elif baseline.is_own:  # the same text scored twice: exactly 0, not float round-off
            answer_reward = 0.0
        else:
            answer_reward = float(scores.log_p_own_answer) - baseline.log_p_answer
        answer_reward = max(answer_reward, C.LOG_VALUE_FLOOR)
    return SegmentRewards(
        C.value_rewards(log_v, cfg.value_space, answer_reward),
        starts,
        scores.entropies,
        scores.cuts,
        log_v,
        scores.log_p_solution,
        scores.log_p_answer,
        answer_reward,
        baseline.solution if baseline is not None else None,
    )


def _exit_end(texts: list[str], begin: int, needle: str) -> int:
    """Index after the token holding the last character of ``needle``, which begins in ``texts[begin]``."""
    at = "".join(texts[begin:]).find(needle)
    if at < 0:
        raise ValueError(f"exit string {needle!r} not found from token {begin}")
    end, total = at + len(needle), 0
    for i, text in enumerate(texts[begin:]):
        total += len(text)
        if total >= end:
            return begin + i + 1
    return len(texts)


register_credit_method(
    CreditMethod(
        "rredcot",
        "exit_values",
        None,
        "Segment rewards from teacher-forced exit-point values, spread uniformly within a segment.",
    )
)
register_credit_method(
    CreditMethod(
        "rredcot+entropy",
        "exit_values",
        "entropy",
        "RREDCoT's segment shares spread over each segment's tokens by entropy.",
    )
)
