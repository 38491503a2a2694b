"""The answer segment's baseline: the final solution the model itself would write at its exit.

The answer segment (the model's own final solution and boxed answer after its exit) is judged by
how well that solution leads to the reference answer, against a baseline solution read at the same
exit state ``s_e``:

    r̂_answer = log p(y_ref | own solution, s_e) − log p(y_ref | baseline solution, s_e)

With the reference solution as baseline, a final solution that faithfully copies a wrong thought is
blamed as much as one that slips: both lead away from ``y_ref``. The fair baseline is what the
model would write at ``s_e`` itself. ``greedy_answer_log_probs`` decodes that solution greedily (a
few dozen tokens per trace, batched, with a KV cache) and teacher-forces
``answer_prefix ⊕ y_ref ⊕ answer_suffix`` right after it, in the same loop: a faithful solution is
its own greedy solution and gets exactly 0, a slip (a sampled token the model did not expect) keeps
its blame.

The loop feeds one token per row per step. A row is first *greedy* (it feeds its argmax; the
solution may begin inside the head, where the caller knows greedy decoding agrees with the trace)
until its decoded text holds the answer prefix (stripped of whitespace, as in ``CreditAssigner``), an EOS,
or ``max_new_tokens``; the tokens from the one holding the prefix's first character on are then
masked out of the cache (their slots never count again, and positions restart there), and the row
is *forced*: it feeds ``answer_prefix ⊕ y_ref ⊕ answer_suffix`` and sums the log-probabilities of
the ``y_ref`` tokens.

Memory: rows are decoded in groups whose tokens (head, decoded solution and forced answer, padded to
the longest) fit ``ScoringBudget.max_batch_tokens``, and logits are computed for the last position
of each row only. A model whose cache cannot drop tokens (linear-attention or state-space layers)
decodes the solutions first and teacher-forces the answer in a separate pass.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence, Set
from dataclasses import dataclass, field

import torch
from torch import Tensor

from rredcot.method.exit_scoring import ScoringBudget, length_chunks
from rredcot.method.forward import (
    decoder_states,
    has_plain_kv_cache,
    model_device,
    next_token_log_probs,
    token_log_probs,
)


@dataclass
class _Row:
    """One head being decoded, then forced."""

    head: list[int]
    forced: list[int]  # answer_prefix ⊕ answer ⊕ answer_suffix, fed after the greedy solution
    answer_span: range  # indices into ``forced`` of the answer tokens
    start: int = 0  # where the final solution begins in ``head``
    generated: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)  # cache slot of each generated token
    fed_forced: int = 0  # forced tokens already fed
    log_p: float = 0.0
    phase: str = "greedy"  # greedy -> forced -> done


def greedy_answer_log_probs(
    model: torch.nn.Module,
    heads: Sequence[Sequence[int]],
    answers: Sequence[Sequence[int]],
    answer_prefix_ids: Sequence[int],
    answer_suffix_ids: Sequence[int],
    stop_at: Callable[[list[int]], int | None],
    eos_ids: Sequence[int],
    max_new_tokens: int,
    solution_starts: Sequence[int] | None = None,
    budget: ScoringBudget | None = None,
) -> tuple[Tensor, list[list[int]]]:
    """``log p(answer | greedy solution, head)`` per row, and each row's greedy solution.

    The final solution begins at ``heads[b][solution_starts[b]]`` (default: after the head, i.e.
    after the exit string); head tokens from there on are the start of the greedy solution, already
    known (the caller checked that the model's argmax agrees with them). ``stop_at(solution)``
    returns the index of the solution token where the answer prefix begins, or None while it has
    not appeared. Generation also ends at an EOS (not kept) or when the solution holds
    ``max_new_tokens``; the answer is then forced after the solution. Returns float32 [rows].
    """
    if len(heads) != len(answers):
        raise ValueError(f"{len(heads)} heads but {len(answers)} answers")
    starts = [len(h) for h in heads] if solution_starts is None else list(solution_starts)
    if len(starts) != len(heads) or any(not 0 <= s <= len(h) for s, h in zip(starts, heads, strict=True)):
        raise ValueError("solution_starts must give one index within each head")
    if not heads:
        return torch.zeros(0), []
    if any(not h for h in heads):
        raise ValueError("every head needs at least one token")
    prefix, suffix = list(answer_prefix_ids), list(answer_suffix_ids)
    if not prefix:
        # After a rollback the next distribution is stale for one token: it must be a prefix token.
        raise ValueError("answer_prefix_ids must not be empty")
    budget = budget or ScoringBudget()
    rows = [
        _Row(list(h), [*prefix, *a, *suffix], range(len(prefix), len(prefix) + len(a)), s)
        for h, a, s in zip(heads, answers, starts, strict=True)
    ]
    eos = set(eos_ids)
    decode = _decode_and_force if has_plain_kv_cache(model) else _decode_then_force
    # Each row may hold its head, a full solution and the forced answer: group rows by that size,
    # as many as the budget allows (each group is a decoding loop of its own: few, full groups).
    sizes = [len(r.head) + max_new_tokens + len(r.forced) for r in rows]
    with torch.inference_mode():
        for group in length_chunks(sizes, budget.max_batch_tokens, band=0.0):
            decode(model, [rows[b] for b in group], stop_at, eos, max_new_tokens, budget)
    return torch.tensor([r.log_p for r in rows], dtype=torch.float32), [r.generated for r in rows]


def _prefill(model: torch.nn.Module, rows: list[_Row], budget: ScoringBudget):  # noqa: ANN202
    """Left-padded pass over the heads: the cache, the mask, next positions and the next log-probs.

    Every head ends at the same slot, so one new slot per step serves all rows; each row's greedy
    solution so far (head tokens from its start on) is registered with its cache slots.
    """
    device = model_device(model)
    width = max(len(r.head) for r in rows)
    for r in rows:
        pad = width - len(r.head)
        r.generated, r.slots = r.head[r.start :], list(range(pad + r.start, width))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, width - len(r.head) :] = torch.tensor(r.head)
        mask[b, width - len(r.head) :] = 1
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    mask, ids, positions = mask.to(device), ids.to(device), positions.to(device)
    hidden, cache = decoder_states(model, ids, mask, positions, use_cache=True)
    log_p = next_token_log_probs(model, hidden[:, -1], budget.max_logit_elements)
    return cache, mask, [len(r.head) for r in rows], log_p


def _step(model, rows, feed, cache, mask, next_pos, budget):  # noqa: ANN001, ANN202
    """Feed one token per row (None: a masked placeholder); returns the new mask and log-probs."""
    device = mask.device
    step_ids = torch.tensor([[t if t is not None else 0] for t in feed], device=device)
    live = torch.tensor([[int(t is not None)] for t in feed], device=device)
    step_pos = torch.tensor([[p] for p in next_pos], device=device)
    for b, t in enumerate(feed):
        if t is not None:
            next_pos[b] += 1
    mask = torch.cat([mask, live], dim=1)
    hidden, _ = decoder_states(model, step_ids, mask, step_pos, past_key_values=cache, use_cache=True)
    return mask, next_token_log_probs(model, hidden[:, -1], budget.max_logit_elements)


def _decode_and_force(
    model: torch.nn.Module,
    rows: list[_Row],
    stop_at: Callable[[list[int]], int | None],
    eos: Set[int],
    max_new_tokens: int,
    budget: ScoringBudget,
) -> None:
    """Greedy decoding and forcing in one cached loop (tokens past a stop are masked out)."""
    cache, mask, next_pos, log_p = _prefill(model, rows, budget)
    longest_forced = max(len(r.forced) for r in rows)
    for _ in range(max_new_tokens + longest_forced + 1):
        feed = [
            _next_token(r, log_p[b], stop_at, eos, max_new_tokens, mask, next_pos, b)
            for b, r in enumerate(rows)
        ]
        if all(r.phase == "done" for r in rows):
            break
        slot = mask.shape[1]
        for b, r in enumerate(rows):
            if r.phase == "greedy" and feed[b] is not None:
                r.slots.append(slot)
        mask, log_p = _step(model, rows, feed, cache, mask, next_pos, budget)


def _decode_then_force(
    model: torch.nn.Module,
    rows: list[_Row],
    stop_at: Callable[[list[int]], int | None],
    eos: Set[int],
    max_new_tokens: int,
    budget: ScoringBudget,
) -> None:
    """For caches that cannot drop tokens: decode every greedy solution, then teacher-force
    ``head ⊕ solution ⊕ forced`` in one right-padded pass and read the answer's log-probabilities."""
    cache, mask, next_pos, log_p = _prefill(model, rows, budget)
    for _ in range(max_new_tokens + 1):
        feed: list[int | None] = []
        for b, r in enumerate(rows):
            token = None
            if r.phase == "greedy":
                token = int(log_p[b].argmax())
                cut = _write(r.generated, token, stop_at, eos, max_new_tokens)
                if cut is not None:
                    del r.generated[cut:]
                    r.phase, token = "forced", None
            feed.append(token)
        if all(t is None for t in feed):
            break
        mask, log_p = _step(model, rows, feed, cache, mask, next_pos, budget)
    del cache
    device = model_device(model)
    seqs = [[*r.head[: r.start], *r.generated, *r.forced] for r in rows]
    width = max(len(q) for q in seqs)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    attention = torch.zeros(len(rows), width, dtype=torch.long)
    picks = []  # (row, position of an answer token)
    for b, (r, q) in enumerate(zip(rows, seqs, strict=True)):
        ids[b, : len(q)] = torch.tensor(q)
        attention[b, : len(q)] = 1
        at = r.start + len(r.generated)
        picks += [(b, at + k) for k in r.answer_span]
    hidden, _ = decoder_states(model, ids.to(device), attention.to(device))
    if picks:
        pick = torch.tensor(picks, device=device)
        lp = token_log_probs(
            model,
            hidden[pick[:, 0], pick[:, 1] - 1],
            ids.to(device)[pick[:, 0], pick[:, 1]],
            budget.max_logit_elements,
        )
        sums = torch.zeros(len(rows), dtype=torch.float64).index_add_(0, pick[:, 0].cpu(), lp.double().cpu())
        for b, r in enumerate(rows):
            r.log_p = float(sums[b])
    for r in rows:
        r.phase = "done"


def _write(
    solution: list[int], token: int, stop_at: Callable[[list[int]], int | None], eos: Set[int], max_new: int
) -> int | None:
    """Add ``token`` to a greedy solution; returns where the solution ends, or None if it goes on.

    An EOS or the length limit ends it before the token (which is not added); the answer prefix
    ends it where the prefix begins.
    """
    if token in eos or len(solution) >= max_new:
        return len(solution)
    solution.append(token)
    return stop_at(solution)


def written_solution(
    tokens: Sequence[int], stop_at: Callable[[list[int]], int | None], eos: Set[int], max_new: int
) -> list[int] | None:
    """The solution greedy decoding ends with after writing ``tokens`` (None: it has not ended)."""
    solution: list[int] = []
    for token in tokens:
        cut = _write(solution, token, stop_at, eos, max_new)
        if cut is not None:
            return solution[:cut]
    return None


def _next_token(
    r: _Row,
    log_p: Tensor,
    stop_at: Callable[[list[int]], int | None],
    eos: Set[int],
    max_new_tokens: int,
    mask: Tensor,
    next_pos: list[int],
    b: int,
) -> int | None:
    """The token row ``b`` feeds next (None: nothing, the row is done); ``log_p`` predicts it."""
    if r.phase == "greedy":
        token = int(log_p.argmax())
        cut = _write(r.generated, token, stop_at, eos, max_new_tokens)
        if cut is None:
            return token
        # The solution ends at generated[cut]: drop what the cache holds from there on.
        dropped = r.slots[cut:]
        if dropped:
            mask[b, dropped] = 0
        next_pos[b] -= len(dropped)
        del r.generated[cut:], r.slots[cut:]
        r.phase = "forced"
    if r.phase == "forced":
        k = r.fed_forced
        # log_p predicts forced[k] given head ⊕ generated ⊕ forced[:k]. Right after a rollback it
        # still predicts the token after the dropped ones, but then k = 0 is an answer-prefix token
        # (the prefix is never empty), whose probability is not read.
        if k in r.answer_span:
            r.log_p += float(log_p[r.forced[k]])
        if k >= len(r.forced):
            r.phase = "done"
            return None
        r.fed_forced += 1
        return r.forced[k]
    return None
