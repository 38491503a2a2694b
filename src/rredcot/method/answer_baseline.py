"""The answer segment's baseline: the final solution the model itself would write at its exit.

The answer segment (the model's own final solution and boxed answer after its exit) is judged by
how well that solution leads to the reference answer, against a baseline solution read at the same
exit state ``s_e``:

    r̂_answer = log p(y_ref | own solution, s_e) − log p(y_ref | baseline solution, s_e)

With the reference solution as baseline, a final solution that faithfully copies a wrong thought is
blamed as much as one that slips: both lead away from ``y_ref``. The fair baseline is what the
model would write at ``s_e`` itself. ``greedy_answer_log_probs`` decodes that solution greedily
(batched, with a KV cache) and teacher-forces ``answer_prefix ⊕ y_ref ⊕ answer_suffix`` right after
it, in the same loop: a faithful solution is its own greedy solution and gets exactly 0, a slip (a
sampled token the model did not expect) keeps its blame.

It is a generation job and runs like one. A step is a fixed set of tensor operations on the device
for all rows, with no host synchronisation, so on a GPU it is captured once as a CUDA graph and
replayed. Each step feeds ``SPECULATE`` tokens per row into a cache whose rows each have a write
position of their own:

- a *greedy* row feeds its greedy token (the argmax at its last position) and, after it, the next
  tokens of its *draft*: the trace's own continuation, which a greedy solution often repeats. The
  model checks them in the same pass; the greedy token and the draft tokens the argmax agrees with
  are kept, the rest is overwritten by the next step (prompt-lookup speculation: the result is
  exactly greedy decoding, in fewer steps when the draft is good);
- a *forced* row feeds its next ``answer_prefix ⊕ y_ref ⊕ answer_suffix`` tokens and adds the
  log-probabilities of the ``y_ref`` tokens they predict.

A row is greedy until its decoded text holds the answer prefix (stripped of whitespace, as in
``CreditAssigner``), an EOS, or ``max_new_tokens``; the host looks at the kept tokens once per
block of steps (``DECODE_BLOCK`` on a GPU, every step on a CPU), and a row whose solution has ended
is rolled back to the token holding the prefix's first character (its write position and positions
restart there: tokens it decoded after the stop are dropped) and is forced from there on.

Memory: rows are decoded in groups whose tokens (head, decoded solution and forced answer, padded to
the longest) fit ``ScoringBudget.max_batch_tokens``, and logits are computed for the last position
of each row only. A model whose cache cannot drop tokens (linear-attention or state-space layers)
decodes the solutions first and teacher-forces the answer in a separate pass.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence, Set
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor

from rredcot.method.forward import (
    LogitHead,
    causal_states,
    compute_dtype,
    decoder_states,
    has_plain_kv_cache,
    model_device,
    pad_right,
    to_host,
)
from rredcot.method.scoring.batching import length_chunks
from rredcot.method.scoring.types import ScoringBudget

_log = logging.getLogger(__name__)

DECODE_BLOCK = 16
"""Decoding steps between two looks of the host at the tokens on a GPU (one wait each). A row whose
solution ends inside a block decodes on to the block's end, wasting at most this many steps; on a
CPU, where looking costs nothing, the host looks after every step."""

SPECULATE = 4
"""Tokens a row feeds per step: its greedy token and up to three draft tokens (greedy rows), or its
next forced tokens (forced rows)."""

GREEDY, FORCED, DONE = 0, 1, 2  # a row's phase, on the device


class SolutionDecoder(Protocol):
    """Greedy decoding by an inference engine that holds exactly the value model's weights: a
    training run's vLLM engine, which has just written the traces with them (its prefix cache holds
    them). :func:`engine_answer_log_probs` takes the solutions from it and scores the answer after
    each with the model, as :func:`greedy_answer_log_probs` does after decoding them itself."""

    def greedy(self, heads: Sequence[Sequence[int]], max_new_tokens: int, stop: str) -> list[list[int]]:
        """Each head's greedy continuation: at most ``max_new_tokens`` tokens, the EOS included when
        it is produced; it may end early once its text holds ``stop``."""
        ...


@dataclass
class _Row:
    """One head being decoded, then forced."""

    head: list[int]
    forced: list[int]  # answer_prefix ⊕ answer ⊕ answer_suffix, fed after the greedy solution
    answer_span: range  # indices into ``forced`` of the answer tokens
    start: int = 0  # where the final solution begins in ``head``
    draft: list[int] = field(default_factory=list)  # expected tokens after the first greedy one
    generated: list[int] = field(default_factory=list)
    log_p: float = 0.0
    phase: int = GREEDY
    done_at: int = 0  # steps after which a forced row has read all it needs

    @property
    def to_feed(self) -> int:
        """Forced tokens a forced row feeds: every one up to the last answer token's predecessor
        (each answer token is predicted by the token before it)."""
        return self.answer_span.stop - 1


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
    drafts: Sequence[Sequence[int]] | None = None,
    block: int | None = None,
    cuda_graphs: bool | None = None,
) -> tuple[Tensor, list[list[int]]]:
    """``log p(answer | greedy solution, head)`` per row, and each row's greedy solution.

    The final solution begins at ``heads[b][solution_starts[b]]`` (default: after the head, i.e.
    after the exit string); head tokens from there on are the start of the greedy solution, already
    known (the caller checked that the model's argmax agrees with them). ``stop_at(solution)``
    returns the index of the solution token where the answer prefix begins, or None while it has
    not appeared. Generation also ends at an EOS (not kept) or when the solution holds
    ``max_new_tokens``; the answer is then forced after the solution. Returns float32 [rows].
    ``drafts[b]``, when given, is what row b is expected to write after its first greedy token (any
    tokens: they only save steps where greedy decoding agrees with them). ``block`` (steps between
    the host's looks) and ``cuda_graphs`` (replay a captured step) default to what suits the device:
    ``DECODE_BLOCK`` and graphs on a GPU, 1 and no graphs elsewhere.
    """
    if len(heads) != len(answers):
        raise ValueError(f"{len(heads)} heads but {len(answers)} answers")
    starts = [len(h) for h in heads] if solution_starts is None else list(solution_starts)
    if len(starts) != len(heads) or any(not 0 <= s <= len(h) for s, h in zip(starts, heads, strict=True)):
        raise ValueError("solution_starts must give one index within each head")
    drafts = [[] for _ in heads] if drafts is None else [list(d) for d in drafts]
    if len(drafts) != len(heads):
        raise ValueError(f"{len(heads)} heads but {len(drafts)} drafts")
    if not heads:
        return torch.zeros(0), []
    if any(not h for h in heads):
        raise ValueError("every head needs at least one token")
    prefix, suffix = list(answer_prefix_ids), list(answer_suffix_ids)
    if not prefix:
        # After a rollback the next distribution is stale for one token: it must be a prefix token.
        raise ValueError("answer_prefix_ids must not be empty")
    if any(not a for a in answers):
        raise ValueError("every answer needs at least one token")
    budget = budget or ScoringBudget()
    rows = [
        _Row(list(h), [*prefix, *a, *suffix], range(len(prefix), len(prefix) + len(a)), s, d[:max_new_tokens])
        for h, a, s, d in zip(heads, answers, starts, drafts, strict=True)
    ]
    eos = set(eos_ids)
    cuda = model_device(model).type == "cuda"
    block = block or (DECODE_BLOCK if cuda else 1)
    cuda_graphs = cuda if cuda_graphs is None else cuda_graphs and cuda
    plain = has_plain_kv_cache(model)
    # After its head a row may hold a solution one token past the limit (the token that shows it),
    # what it keeps decoding until the host looks (up to a block of steps), the forced tokens, and
    # one step's tokens beyond its write position: group rows by head plus that, as many as the
    # budget allows (each group is a decoding loop of its own).
    room = max_new_tokens + 1 + SPECULATE * (block + 1) + max(len(r.forced) for r in rows)
    sizes = [len(r.head) + room + SPECULATE for r in rows]
    with torch.inference_mode():
        head = LogitHead(model, budget.max_logit_elements)
        for group in length_chunks(sizes, budget.max_batch_tokens, band=0.0):
            members = [rows[b] for b in group]
            if plain:
                _Decoder(model, head, members, max_new_tokens, block, room).run(stop_at, eos, cuda_graphs)
            else:
                _decode_then_force(model, head, members, stop_at, eos, max_new_tokens)
    return torch.tensor([r.log_p for r in rows], dtype=torch.float32), [r.generated for r in rows]


def engine_answer_log_probs(
    model: torch.nn.Module,
    decoder: SolutionDecoder,
    heads: Sequence[Sequence[int]],
    answers: Sequence[Sequence[int]],
    answer_prefix_ids: Sequence[int],
    answer_suffix_ids: Sequence[int],
    stop_at: Callable[[list[int]], int | None],
    stop_text: str,
    eos_ids: Sequence[int],
    max_new_tokens: int,
    solution_starts: Sequence[int] | None = None,
    budget: ScoringBudget | None = None,
) -> tuple[Tensor, list[list[int]]]:
    """What :func:`greedy_answer_log_probs` returns, with the greedy solutions written by ``decoder``:
    each row's continuation is cut where greedy decoding would end it here (the answer prefix, as
    ``stop_at`` finds it, an EOS, or ``max_new_tokens`` solution tokens), then ``answer_prefix ⊕
    answer ⊕ answer_suffix`` is teacher-forced after it by ``model`` in one pass per group of rows.
    ``stop_text`` (the answer prefix's text) lets the engine stop early; the cut is ``stop_at``'s."""
    if len(heads) != len(answers):
        raise ValueError(f"{len(heads)} heads but {len(answers)} answers")
    starts = [len(h) for h in heads] if solution_starts is None else list(solution_starts)
    if not heads:
        return torch.zeros(0), []
    prefix, suffix = list(answer_prefix_ids), list(answer_suffix_ids)
    rows = [
        _Row(list(h), [*prefix, *a, *suffix], range(len(prefix), len(prefix) + len(a)), s)
        for h, a, s in zip(heads, answers, starts, strict=True)
    ]
    # One token past the limit, so that the cut at the limit is seen as greedy decoding sees it.
    continuations = decoder.greedy([r.head for r in rows], max_new_tokens + 1, stop_text)
    eos = set(eos_ids)
    for r, more in zip(rows, continuations, strict=True):
        written = r.head[r.start :] + list(more)
        solution = written_solution(written, stop_at, eos, max_new_tokens)
        # None: the engine stopped short of every end (its context limit); keep what it wrote.
        r.generated = written[:max_new_tokens] if solution is None else solution
    budget = budget or ScoringBudget()
    sizes = [r.start + len(r.generated) + len(r.forced) for r in rows]
    with torch.inference_mode():
        head = LogitHead(model, budget.max_logit_elements)
        for group in length_chunks(sizes, budget.max_batch_tokens):
            _force_answers(model, head, [rows[b] for b in group])
    return torch.tensor([r.log_p for r in rows], dtype=torch.float32), [r.generated for r in rows]


def _prefill(model: torch.nn.Module, rows: list[_Row]) -> tuple[Tensor, object, Tensor, Tensor]:
    """Left-padded pass over the heads for a cache that cannot skip slots (recurrent layers read
    every token fed): last hidden states, the cache, the 2D mask and next positions. Every head ends
    at the same slot, so one new slot per step serves all rows."""
    device = model_device(model)
    width = max(len(r.head) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, width - len(r.head) :] = torch.tensor(r.head)
        mask[b, width - len(r.head) :] = 1
        r.generated = r.head[r.start :]
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    mask, ids, positions = (t.to(device, non_blocking=True) for t in (mask, ids, positions))
    hidden, cache = decoder_states(model, ids, mask, positions, use_cache=True)
    next_pos = torch.tensor([len(r.head) for r in rows], device=device)
    return hidden[:, -1], cache, mask, next_pos


class _Decoder:
    """Greedy decoding and forcing of one group of rows, in one cached loop.

    The device holds every row's state (phase, write position, next position, forced tokens fed,
    draft position, summed answer log-probability) and :meth:`step` advances all rows without
    looking at the host; :meth:`look` is the host's part: it reads the tokens kept since its last
    look and rolls back the rows whose solution ended."""

    def __init__(
        self,
        model: torch.nn.Module,
        head: LogitHead,
        rows: list[_Row],
        max_new_tokens: int,
        block: int,
        room: int,
    ) -> None:
        self.model, self.head, self.rows = model, head, rows
        self.max_new, self.block, self.k = max_new_tokens, block, SPECULATE
        device = model_device(model)
        n = len(rows)
        # Right-padded heads (no mask: pad_right); row b's head fills slots [0, len_b).
        ids = pad_right([r.head for r in rows])
        self.width = ids.shape[1]
        hidden, prefill = decoder_states(model, ids.to(device, non_blocking=True), use_cache=True)
        for r in rows:
            r.generated = r.head[r.start :]
        self.head_len = torch.tensor([len(r.head) for r in rows]).to(device, non_blocking=True)
        self.next_pos = self.head_len.clone()
        self.at = torch.full((n,), self.width, dtype=torch.long, device=device)
        last = hidden[torch.arange(n, device=device), self.head_len - 1]
        from transformers import StaticCache

        from rredcot.method.row_cache import RowLayer

        self.cache = StaticCache(config=model.config, max_cache_len=self.width + room)
        self.cache.layers = [
            RowLayer(layer.keys, layer.values, self.width + room, self.at) for layer in prefill.layers
        ]
        del prefill, hidden
        self.slots = torch.arange(self.width + room, device=device)
        self.offsets = torch.arange(self.k, device=device)
        meta = pad_right([[len(r.draft), r.answer_span.start, r.answer_span.stop] for r in rows])
        self.draft_len, self.answer_from, self.answer_to = meta.to(device, non_blocking=True).unbind(1)
        self.forced = pad_right([r.forced + [0] * self.k for r in rows]).to(device, non_blocking=True)
        self.draft = pad_right([r.draft + [0] * self.k for r in rows]).to(device, non_blocking=True)
        self.draft_at = torch.zeros(n, dtype=torch.long, device=device)
        self.phase = torch.full((n,), GREEDY, dtype=torch.long, device=device)
        self.fed = torch.zeros(n, dtype=torch.long, device=device)
        self.log_p = torch.zeros(n, dtype=torch.float64, device=device)
        self.step_at = torch.zeros(1, dtype=torch.long, device=device)
        # What each step kept per row: its tokens and how many (greedy rows), for the host. Greedy
        # rows keep at least one token a step, the host stops them within a block of the limit,
        # then they force k tokens a step.
        longest = max(r.to_feed for r in rows)
        capacity = max_new_tokens + 1 + block + -(-longest // self.k) + 1
        self.kept = torch.zeros(n, capacity, self.k, dtype=torch.long, device=device)
        self.kept_n = torch.zeros(n, capacity, dtype=torch.long, device=device)
        self.dtype = compute_dtype(model)
        self.greedy, _ = self.head.argmax_and_log_probs(last, torch.zeros_like(self.at))

    def step(self) -> None:
        """Feed ``k`` tokens per row (on the device only: no host synchronisation, graph-capturable)."""
        k, greedy, forcing = self.k, self.phase == GREEDY, self.phase == FORCED
        # Greedy rows: the greedy token, then the draft; forced rows: the next forced tokens.
        draft_at = self.draft_at[:, None] + self.offsets[None, : k - 1]
        draft = self.draft.gather(1, draft_at.clamp(max=self.draft.shape[1] - 1))
        guess = torch.cat([self.greedy[:, None], draft], dim=1)
        forced = self.forced.gather(1, self.fed[:, None] + self.offsets[None, :])
        tokens = torch.where(greedy[:, None], guess, torch.where(forcing[:, None], forced, 0))
        # Each fed token may read its row's head, what it decoded, and this step's tokens before it.
        mask = (self.slots < self.head_len[:, None, None]) | (
            (self.slots >= self.width) & (self.slots <= (self.at[:, None] + self.offsets)[:, :, None])
        )
        additive = torch.zeros((), dtype=self.dtype, device=mask.device)
        additive = additive.masked_fill(~mask, torch.finfo(self.dtype).min)[:, None]
        positions = self.next_pos[:, None] + self.offsets
        hidden, _ = decoder_states(self.model, tokens, additive, positions, self.cache, use_cache=True)
        # After each fed token: the argmax, and the log-probability of the next forced token.
        forced_at = self.fed[:, None] + self.offsets[None, :]
        target = self.forced.gather(1, forced_at + 1)
        best, log_p = self.head.argmax_and_log_probs(hidden.flatten(0, 1), target.flatten())
        best, log_p = best.view(tokens.shape), log_p.view(tokens.shape)
        # Greedy rows keep the greedy token and the draft tokens the argmax agrees with.
        drafted = draft_at < self.draft_len[:, None]
        agree = (best[:, :-1] == draft) & drafted
        kept_greedy = 1 + agree.long().cumprod(dim=1).sum(dim=1)
        # Forced rows: each fed token predicts the next forced token; the answer's are summed.
        reading = forcing[:, None] & (forced_at + 1 >= self.answer_from[:, None])
        reading = reading & (forced_at + 1 < self.answer_to[:, None])
        self.log_p += (log_p.double() * reading).sum(dim=1)
        kept_forced = (self.answer_to - 1 - self.fed).clamp(min=0, max=k)
        kept = torch.where(greedy, kept_greedy, torch.where(forcing, kept_forced, 0))
        self.kept.index_copy_(1, self.step_at, tokens[:, None])
        self.kept_n.index_copy_(1, self.step_at, torch.where(greedy, kept_greedy, 0)[:, None])
        self.greedy.copy_(torch.where(greedy, best.gather(1, (kept_greedy - 1)[:, None]).squeeze(1), 0))
        self.draft_at += torch.where(greedy, kept_greedy, 0)
        self.fed += torch.where(forcing, kept_forced, 0)
        self.phase.masked_fill_(forcing & (self.fed >= self.answer_to - 1), DONE)
        self.at += kept
        self.next_pos += kept
        self.step_at += 1

    def look(self, since: int, until: int, stop_at: Callable[[list[int]], int | None], eos: Set[int]) -> None:
        """Read the tokens greedy rows kept in steps ``[since, until)`` and roll back the rows whose
        solution ended (one host synchronisation). A rolled-back row then feeds its forced tokens,
        ``k`` a step: the host knows when it is done."""
        tokens, counts = to_host(self.kept[:, since:until], self.kept_n[:, since:until])
        stopped, heads, ats, positions = [], [], [], []
        for b, r in enumerate(self.rows):
            if r.phase != GREEDY:
                continue
            row = tokens[b].tolist()
            fed = [t for step, n in zip(row, counts[b].tolist(), strict=True) for t in step[:n]]
            for token in fed:
                cut = _write(r.generated, token, stop_at, eos, self.max_new)
                if cut is None:
                    continue
                # Drop everything from generated[cut] on and restart there. The solution's first
                # tokens may lie in the head (slots start..len(head)); decoded ones from slot width on.
                in_head = len(r.head) - r.start
                heads.append(r.start + cut if cut < in_head else len(r.head))
                ats.append(self.width + max(0, cut - in_head))
                del r.generated[cut:]
                stopped.append(b)
                positions.append(r.start + cut)
                r.phase, r.done_at = FORCED, until + -(-r.to_feed // self.k)
                break
        if stopped:
            device = self.at.device
            index = torch.tensor(stopped, device=device)
            self.head_len[index] = torch.tensor(heads, device=device)
            self.at[index] = torch.tensor(ats, device=device)
            self.next_pos[index] = torch.tensor(positions, device=device)
            self.phase[index] = FORCED
            self.fed[index] = 0

    def run(self, stop_at: Callable[[list[int]], int | None], eos: Set[int], cuda_graphs: bool) -> None:
        """Decode and force until every row is done; the rows' solutions and log-probabilities."""
        step, at, looked = self.step, 0, 0
        if cuda_graphs:
            step = self._captured()
            at = 1  # the capture's warm-up step ran for real
        while any(r.phase == GREEDY for r in self.rows):
            n = min(self.block - at % self.block, self.kept.shape[1] - at)
            if n <= 0:
                raise RuntimeError("greedy baseline: the decoding loop ran past its capacity")
            for _ in range(n):
                step()
            at += n
            self.look(looked, at, stop_at, eos)
            looked = at
        for _ in range(max(r.done_at for r in self.rows) - at):  # the forced tails, then done
            step()
        (log_p,) = to_host(self.log_p)
        for r, value in zip(self.rows, log_p.tolist(), strict=True):
            r.log_p, r.phase = value, DONE

    def _captured(self) -> Callable[[], None]:
        """One step run once (the warm-up a capture needs), then captured as a CUDA graph; its replay
        is the step. If the model's forward cannot be captured, the plain step (said once)."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                self.step()
        except RuntimeError as exc:  # a forward that synchronises or allocates on the host
            _warn_once(f"greedy baseline: CUDA graph capture failed ({exc}); decoding without graphs")
            return self.step
        return graph.replay


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        _log.warning(message)


def _decode_then_force(
    model: torch.nn.Module,
    head: LogitHead,
    rows: list[_Row],
    stop_at: Callable[[list[int]], int | None],
    eos: Set[int],
    max_new_tokens: int,
) -> None:
    """For caches that cannot drop tokens: decode every greedy solution, then teacher-force
    ``head ⊕ solution ⊕ forced`` in one right-padded pass and read the answer's log-probabilities."""
    last, cache, mask, next_pos = _prefill(model, rows)
    best = head.logits(last).argmax(dim=-1)
    device = mask.device
    for _ in range(max_new_tokens + 1):
        (best,) = to_host(best)
        feed: list[int | None] = []
        for b, r in enumerate(rows):
            token = None
            if r.phase == GREEDY:
                token = int(best[b])
                cut = _write(r.generated, token, stop_at, eos, max_new_tokens)
                if cut is not None:
                    del r.generated[cut:]
                    r.phase, token = FORCED, None
            feed.append(token)
        if all(t is None for t in feed):
            break
        live = torch.tensor([[int(t is not None)] for t in feed], device=device)
        step_ids = torch.tensor([[t if t is not None else 0] for t in feed], device=device)
        mask = torch.cat([mask, live], dim=1)
        hidden, _ = decoder_states(model, step_ids, mask, next_pos[:, None], cache, use_cache=True)
        next_pos = next_pos + live[:, 0]
        best = head.logits(hidden[:, -1]).argmax(dim=-1)
    del cache
    _force_answers(model, head, rows)


def _force_answers(model: torch.nn.Module, head: LogitHead, rows: list[_Row]) -> None:
    """Teacher-force ``head[:start] ⊕ solution ⊕ forced`` of every row in one right-padded pass and
    sum the log-probabilities of the answer tokens into ``log_p``."""
    device = model_device(model)
    seqs = [[*r.head[: r.start], *r.generated, *r.forced] for r in rows]
    ids = pad_right(seqs).to(device, non_blocking=True)
    picks = []  # (row, position of an answer token)
    for b, r in enumerate(rows):
        at = r.start + len(r.generated)
        picks += [(b, at + k) for k in r.answer_span]
    hidden = causal_states(model, ids)
    if picks:
        pick = torch.tensor(picks, device=device)
        lp = head.token_log_probs(hidden[pick[:, 0], pick[:, 1] - 1], ids[pick[:, 0], pick[:, 1]])
        sums = torch.zeros(len(rows), dtype=torch.float64, device=device)
        (sums,) = to_host(sums.index_add_(0, pick[:, 0], lp.double()))
        for b, r in enumerate(rows):
            r.log_p = float(sums[b])
    for r in rows:
        r.phase = DONE


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
