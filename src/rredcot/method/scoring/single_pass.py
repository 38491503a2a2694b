"""Single-pass exit-point scoring: the shared prefix is computed once.

(docs/method.md, "Single-pass scoring".)

Every exit point of a trace reads the same prefix ``prompt ⊕ completion[:c]``, so scoring K exit
points does not need K forward passes over growing prefixes (≈ K·L/2 tokens, ``naive.py``).
Here it costs about ``L + K·A`` tokens:

1. **Trace pass.** One forward over ``prompt ⊕ completion`` per trace (batched, right-padded) keeps
   the KV cache and, from the same logits, the completion's token entropies (for segmentation).
2. **Suffix pass.** For cut ``c`` the suffix ``last prefix token ⊕ exit ⊕ solution ⊕ answer_prefix ⊕
   answer ⊕ answer_suffix`` is run on top of that cache. All suffixes of a trace are packed into one
   row with a tree-shaped attention mask: a suffix sees the cached keys of its own prefix (positions
   ``< P + c - 1``) and, causally, its own tokens, never another suffix; its position ids restart at
   ``P + c - 1``, so every token sits exactly where it would in the naive sequence.

The last prefix token is fed again as the suffix's first token (its cached copy is masked out) so
that the logits predicting the first exit/solution token come from the suffix pass too; this costs
one token per exit point and keeps a uniform layout even for an empty exit string.

Why cache + packed mask rather than one packed sequence: the cuts depend on the segmentation, which
depends on the entropies of the trace pass, so the trace must be read before the suffixes exist.

Nothing is scored twice. A group of sampled completions often repeats itself: identical traces, and
exit points whose prefix ``prompt ⊕ completion[:c]`` is the same in several traces (cut 0 always is).
Identical traces share one trace pass, and suffixes with the same prefix and the same tokens share one
suffix row; their sums are copied to every exit point they stand for. On the embedded default this
halves the suffix tokens and saves a quarter of the trace tokens.

Requirements on the model: an HF causal LM whose attention takes a 4D additive mask (``eager`` or
``sdpa``; FlashAttention-2 does not), whose cache keeps keys and values of every position in every
layer (no sliding-window, linear-attention or state-space layers: ``forward.has_plain_kv_cache``),
and that exposes ``get_decoder()`` and ``get_output_embeddings()``. ``CreditAssigner`` falls back to
the naive scorer for any other model. Logits are computed only at the positions that are read, in
chunks, so vocabulary size does not multiply the memory of long traces.

Memory (``ScoringBudget``): a trace pass holds at most ``max_batch_tokens`` tokens (one trace longer
than that gets a pass of its own). A suffix pass reads its rows' cached keys up to the latest exit
it serves, sliced before they are copied (a one-row pass copies nothing), and holds at most
``max_batch_tokens`` cached plus query tokens and ``max_mask_elements`` mask entries.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from rredcot.method.forward import (
    LogitHead,
    compute_dtype,
    decoder_states,
    has_plain_kv_cache,
    model_device,
    pad_right,
    to_host,
)
from rredcot.method.scoring.batching import distinct_traces, length_chunks, spans
from rredcot.method.scoring.entropies import completion_predictions_at, split_predictions
from rredcot.method.scoring.types import ExitStrings, ScoringBudget, TraceExits, TraceScores

if TYPE_CHECKING:
    from transformers import DynamicCache

__all__ = ["score_traces_single_pass", "supports_single_pass"]

# Attention implementations known to honour an arbitrary 4D additive mask.
MASK_CAPABLE = ("eager", "sdpa")

# Packing of suffixes (see ``_pack``), chosen by measurement with ``rredcot bench``: smaller rows
# waste less attention on other suffixes' masked keys but copy the prefix keys more often.
ROW_QUERY_FRACTION = 8
PASS_KEY_BAND = 0.7


def supports_single_pass(model: torch.nn.Module) -> bool:
    """True when the model's attention accepts the tree-shaped 4D mask this module builds and its
    cache can be cut at every exit point (every layer a plain key/value cache)."""
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    return impl in MASK_CAPABLE and hasattr(model, "get_decoder") and has_plain_kv_cache(model)


# --------------------------------------------------------------------------------------------------
# Trace pass
# --------------------------------------------------------------------------------------------------


@dataclass
class _TraceChunk:
    """KV cache of a chunk of traces after the trace pass."""

    indices: list[int]  # trace indices, one per cache row
    cache: DynamicCache
    width: int  # cached (padded) length


def _run_trace_pass(
    model: torch.nn.Module, head: LogitHead, traces: Sequence[TraceExits], rows: list[int]
) -> tuple[_TraceChunk, list[tuple[Tensor, Tensor]]]:
    """Forward ``prompt ⊕ completion`` for the given traces; returns the cache and, per trace (on the
    host: segmentation reads them), the completion's entropies and the token the model finds most
    likely at each completion position (-1: none)."""
    from transformers import DynamicCache

    device = model_device(model)
    input_ids = pad_right([[*traces[i].prompt_ids, *traces[i].completion_ids] for i in rows])
    # Right padding: real tokens keep positions 0..n-1 and no real query reads a padded key (no mask
    # needed, pad_right); the suffix pass reads cached keys before its exit point only.
    hidden, cache = decoder_states(
        model,
        input_ids.to(device, non_blocking=True),
        past_key_values=DynamicCache(config=model.config),
        use_cache=True,
    )
    lengths = [(len(traces[i].prompt_ids), len(traces[i].completion_ids)) for i in rows]
    entropies, best = to_host(*completion_predictions_at(head, hidden, lengths))
    return _TraceChunk(rows, cache, input_ids.shape[1]), split_predictions(entropies, best, lengths)


# --------------------------------------------------------------------------------------------------
# Suffix pass
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Suffix:
    """One (cut, reference pair) suffix of one trace."""

    trace: int  # index into the traces
    row: int  # cache row of the trace in its chunk
    out: int  # flat output index: cut-major within the trace
    start_pos: int  # position id of the suffix's first token (= P + c - 1)
    ids: list[int]
    solution_at: int  # offset of the solution span within the suffix
    solution_len: int
    answer_at: int
    answer_len: int

    @property
    def fed(self) -> int:
        """Tokens to run: the last scored token is predicted by the one before it, so it and
        anything after it (the answer suffix) need no pass of their own."""
        return max(1, self.solution_at + self.solution_len - 1, self.answer_at + self.answer_len - 1)


def _suffixes(
    traces: Sequence[TraceExits],
    chunk: _TraceChunk,
    members: dict[int, list[int]],
    cuts: dict[int, list[int]],
    strings: ExitStrings,
) -> list[_Suffix]:
    """Every (cut, pair) suffix and own-answer suffix of the chunk's traces; the traces that
    ``members`` lists under a cache row's trace read that row."""
    jobs = []
    for row, rep in enumerate(chunk.indices):
        for t in members[rep]:
            jobs += _trace_suffixes(t, traces[t], row, cuts[t], strings)
    return jobs


def _trace_suffixes(
    t: int, trace: TraceExits, row: int, cuts: list[int], strings: ExitStrings
) -> list[_Suffix]:
    jobs = []
    prefix = [*trace.prompt_ids, *trace.completion_ids]
    n_pairs = len(trace.pairs)
    for k, c in enumerate(cuts):
        if not 0 <= c <= len(trace.completion_ids):
            raise ValueError(f"cut {c} outside [0, {len(trace.completion_ids)}] in trace {t}")
        last = len(trace.prompt_ids) + c - 1
        if last < 0:
            raise ValueError("prompt and completion prefix are both empty at cut 0")
        head = [prefix[last], *strings.exit_ids]
        for j, (solution, answer) in enumerate(trace.pairs):
            ids = [*head, *solution, *strings.answer_prefix_ids, *answer, *strings.answer_suffix_ids]
            answer_at = len(head) + len(solution) + len(strings.answer_prefix_ids)
            jobs.append(
                _Suffix(t, row, k * n_pairs + j, last, ids, len(head), len(solution), answer_at, len(answer))
            )
    if trace.answer_cut is not None:
        # The first pair's answer right after the model's own solution: one more output slot.
        last = len(trace.prompt_ids) + trace.answer_cut - 1
        if not 0 <= trace.answer_cut <= len(trace.completion_ids) or last < 0:
            raise ValueError(f"answer cut {trace.answer_cut} outside the completion of trace {t}")
        answer = trace.pairs[0][1]
        ids = [prefix[last], *strings.answer_prefix_ids, *answer, *strings.answer_suffix_ids]
        out = len(cuts) * n_pairs
        jobs.append(_Suffix(t, row, out, last, ids, 1, 0, 1 + len(strings.answer_prefix_ids), len(answer)))
    return jobs


def _distinct(
    jobs: list[_Suffix], traces: Sequence[TraceExits]
) -> tuple[list[_Suffix], list[tuple[_Suffix, _Suffix]]]:
    """Suffixes to run, and (copy, original) pairs for those whose scores another suffix gives.

    Two suffixes score the same when their prefix up to the re-fed token and their own tokens are
    equal: the sequence the model reads is then identical, wherever its prefix is cached.
    """
    first: dict[tuple, _Suffix] = {}
    run, copies = [], []
    whole: dict[int, tuple[int, ...]] = {}
    for job in jobs:
        if job.trace not in whole:
            whole[job.trace] = (*traces[job.trace].prompt_ids, *traces[job.trace].completion_ids)
        key = (whole[job.trace][: job.start_pos], tuple(job.ids))
        if key in first:
            copies.append((job, first[key]))
        else:
            first[key] = job
            run.append(job)
    return run, copies


def _key_width(row: list[_Suffix]) -> int:
    """Cached keys a row needs: every suffix reads only the prefix before its re-fed token."""
    return max(job.start_pos for job in row)


def _pack(jobs: list[_Suffix], width: int, budget: ScoringBudget) -> list[list[list[_Suffix]]]:
    """Group suffixes into passes of rows; a row holds consecutive suffixes of one trace.

    The tree mask is dense, so a query pays for every key of its row, allowed or not. Two choices
    keep that waste small: a row holds about ``width / ROW_QUERY_FRACTION`` query tokens (its
    own-suffix block stays small next to the prefix), and a pass reads only the cached keys its rows
    need, ``max start_pos``: rows are sorted by it and a pass only takes rows that need at least
    ``PASS_KEY_BAND`` of its keys, so early cuts run against a short prefix. The budgets bound a pass:
    rows × (keys + Q_max) <= ``max_batch_tokens`` (the cached keys each row reads count: they are
    copied for the pass) and rows × Q_max × (keys + Q_max) <= ``max_mask_elements``. A row that alone
    exceeds them (a trace longer than the budget) is a pass of its own.
    """

    def fits(n_rows: int, q: int, keys: int) -> bool:
        return (
            n_rows * (keys + q) <= budget.max_batch_tokens
            and n_rows * q * (keys + q) <= budget.max_mask_elements
        )

    rows: list[list[_Suffix]] = []
    cap = max(width // ROW_QUERY_FRACTION, 1)
    for job in jobs:
        row = rows[-1] if rows else None
        q = sum(j.fed for j in row) + job.fed if row else 0
        if row and row[0].trace == job.trace and q <= cap and fits(1, q, width):
            row.append(job)
        else:
            rows.append([job])
    rows.sort(key=_key_width, reverse=True)
    passes: list[list[list[_Suffix]]] = []
    q_max = keys = 0
    for row in rows:
        q = sum(j.fed for j in row)
        banded = _key_width(row) >= PASS_KEY_BAND * keys  # do not read many keys a row cannot use
        if passes and banded and fits(len(passes[-1]) + 1, max(q_max, q), keys):
            passes[-1].append(row)
            q_max = max(q_max, q)
        else:
            passes.append([row])
            q_max, keys = q, _key_width(row)  # the first row of a pass needs the most keys
    return passes


def _row_cache(chunk: _TraceChunk, rows: list[int], keys: int) -> DynamicCache:
    """A fresh cache with the first ``keys`` cached positions of the given rows; the suffix pass
    appends to it and the trace pass's cache stays as it was.

    Keys are sliced before rows are selected, so only ``rows x keys`` positions are copied; a pass
    of one row takes a view and copies nothing (the pass's own append makes the one copy).
    """
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    layers = []
    for layer in chunk.cache.layers:
        k, v = layer.keys[:, :, :keys], layer.values[:, :, :keys]
        if len(rows) == 1:
            k, v = k[rows[0] : rows[0] + 1], v[rows[0] : rows[0] + 1]
        else:
            index = torch.tensor(rows, device=k.device)
            k, v = k.index_select(0, index), v.index_select(0, index)
        fresh = DynamicLayer()
        fresh.lazy_initialization(k, v)
        fresh.keys, fresh.values = k, v
        layers.append(fresh)
    cache = DynamicCache()  # filled with ready layers (its constructor would copy given tensors)
    cache.layers = layers
    return cache


def _run_suffix_pass(
    model: torch.nn.Module,
    head: LogitHead,
    chunk: _TraceChunk,
    packed: list[list[_Suffix]],
    flat: Tensor,
    slot: Callable[[_Suffix, bool], int],
) -> None:
    """Score one pass of packed suffix rows; add span log-prob sums at ``flat[slot(job, is_answer)]``
    (``flat`` lives on the model's device; nothing here waits for the device).

    The inputs are described per suffix (its row, offset, length, first position), expanded to
    per-query tensors with tensor operations, and the tree mask is built from them on the device:
    query q of a suffix starting at offset o may read cached key k < start_pos and its own keys
    ``width + o <= k <= width + q``."""
    device = model_device(model)
    dtype = compute_dtype(model)
    n_rows = len(packed)
    q_len = max(sum(j.fed for j in row) for row in packed)
    width = max(_key_width(row) for row in packed)  # cached keys this pass reads
    fed: list[int] = []  # the fed tokens of every suffix, in order
    begin, count, start_pos, offsets = [], [], [], []  # per suffix: flat query index, fed, position
    span_at, span_len, span_dest = [], [], []  # per scored span: flat query index of its first target
    targets: list[int] = []
    for r, row in enumerate(packed):
        offset = 0
        for job in row:
            n = job.fed
            fed += job.ids[:n]
            begin.append(r * q_len + offset)
            count.append(n)
            start_pos.append(job.start_pos)
            offsets.append(offset)
            # Suffix token i + 1 is predicted at query offset + i.
            for at, length, is_answer in (
                (job.solution_at, job.solution_len, False),
                (job.answer_at, job.answer_len, True),
            ):
                span_at.append(r * q_len + offset + at - 1)
                span_len.append(length)
                span_dest.append(slot(job, is_answer))
                targets += job.ids[at : at + length]
            offset += n
    queries = spans(begin, count)  # flat query index of every fed token
    which = torch.repeat_interleave(
        torch.arange(len(count)), torch.tensor(count), output_size=queries.numel()
    )
    within = queries - torch.tensor(begin)[which]
    size = n_rows * q_len
    first = torch.tensor(start_pos)[which]
    input_ids = torch.zeros(size, dtype=torch.long).index_put_((queries,), torch.tensor(fed))
    positions = torch.zeros(size, dtype=torch.long).index_put_((queries,), first + within)
    # Per query: keys below ``prefix`` (cached) and own keys from ``own`` on; padding queries read
    # only themselves, so that no row is fully masked.
    prefix = torch.zeros(size, dtype=torch.long).index_put_((queries,), first)
    own = torch.arange(q_len).repeat(n_rows).index_put_((queries,), torch.tensor(offsets)[which])
    meta = torch.stack([input_ids, positions, prefix, own]).view(4, n_rows, q_len)
    input_ids, positions, prefix, own = meta.to(device, non_blocking=True)
    keys = torch.arange(width + q_len, device=device)
    query = torch.arange(q_len, device=device)[None, :, None]
    allowed = (keys < prefix[:, :, None]) | ((keys >= width + own[:, :, None]) & (keys <= width + query))
    # Additive mask: 0 where a query may attend, the dtype's minimum elsewhere (eager and sdpa).
    mask = torch.zeros((), dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)
    cache = _row_cache(chunk, [row[0].row for row in packed], width)
    hidden, _ = decoder_states(
        model,
        input_ids,
        attention_mask=mask[:, None],
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
    )
    del cache, mask, allowed
    at = spans(span_at, span_len)
    if at.numel() == 0:
        return
    lengths = torch.tensor(span_len)
    dest = torch.repeat_interleave(torch.tensor(span_dest), lengths, output_size=at.numel())
    moved = torch.stack([at, torch.tensor(targets), dest]).to(device, non_blocking=True)
    log_p = head.token_log_probs(hidden.flatten(0, 1)[moved[0]], moved[1])
    flat.index_add_(0, moved[2], log_p.to(flat.dtype))


# --------------------------------------------------------------------------------------------------
# Public entry point
# --------------------------------------------------------------------------------------------------


CutsFor = Callable[[int, Tensor], Sequence[int]]


def score_traces_single_pass(
    model: torch.nn.Module,
    traces: Sequence[TraceExits],
    strings: ExitStrings,
    budget: ScoringBudget | None = None,
    cuts_for: CutsFor | None = None,
) -> list[TraceScores]:
    """Exit-point scores of many traces, each shared prefix computed once.

    ``traces[i].cuts`` gives the exit points; when it is None, ``cuts_for(i, entropies)`` chooses
    them from the completion's token entropies (bits) of the trace pass, so segmentation costs no
    extra forward pass. Returns, per trace, the entropies and float32 ``log p(u|s)``, ``log p(y|u,s)``
    of shape [n_cuts, n_pairs], equal to ``naive.score_traces_naive`` up to float round-off.
    The model's train/eval mode is left as the caller set it.
    """
    budget = budget or ScoringBudget()
    if not supports_single_pass(model):
        impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
        raise ValueError(f"single-pass scoring needs attention 'eager' or 'sdpa', not {impl!r}")
    device = model_device(model)
    # Identical traces (same prompt and completion) share one trace pass and one cache row.
    members = distinct_traces([(t.prompt_ids, t.completion_ids) for t in traces])
    reps = list(members)
    lengths = [len(traces[i].prompt_ids) + len(traces[i].completion_ids) for i in reps]
    done: list[tuple[dict[int, int], int, Tensor]] = []  # per trace chunk: offsets, n_out, sums
    cuts: dict[int, list[int]] = {}
    predictions: dict[int, tuple[Tensor, Tensor]] = {}
    with torch.inference_mode():
        head = LogitHead(model, budget.max_logit_elements)
        for positions in length_chunks(lengths, budget.max_batch_tokens):
            rows = [reps[j] for j in positions]
            # The one wait of a chunk: segmentation reads the entropies on the host.
            chunk, rep_predictions = _run_trace_pass(model, head, traces, rows)
            chunk_traces = [i for rep in rows for i in members[rep]]
            for rep, prediction in zip(rows, rep_predictions, strict=True):
                for i in members[rep]:
                    predictions[i] = prediction
            for i in chunk_traces:
                given = traces[i].cuts
                if given is None:
                    if cuts_for is None:
                        raise ValueError(f"trace {i} has no cuts and no cuts_for was given")
                    given = cuts_for(i, predictions[i][0])
                cuts[i] = [int(c) for c in given]
            # One flat float64 buffer per chunk on the device: [solution sums | answer sums], trace
            # after trace; it reaches the host after the last chunk.
            base, n_out = {}, 0
            for i in chunk_traces:
                base[i] = n_out
                n_out += len(cuts[i]) * len(traces[i].pairs) + (traces[i].answer_cut is not None)
            flat = torch.zeros(2 * n_out, dtype=torch.float64, device=device)

            def slot(job: _Suffix, is_answer: bool, base: dict = base, n_out: int = n_out) -> int:
                return base[job.trace] + job.out + (n_out if is_answer else 0)

            run, copies = _distinct(_suffixes(traces, chunk, members, cuts, strings), traces)
            for packed in _pack(run, chunk.width, budget):
                _run_suffix_pass(model, head, chunk, packed, flat, slot)
            if copies:
                for is_answer in (False, True):
                    to = torch.tensor([slot(job, is_answer) for job, _ in copies], device=device)
                    src = torch.tensor([slot(original, is_answer) for _, original in copies], device=device)
                    flat[to] = flat[src]
            done.append((base, n_out, flat))
            del chunk
    results: list[TraceScores | None] = [None] * len(traces)
    for (base, n_out, _), flat in zip(done, to_host(*(flat for *_, flat in done)), strict=True):
        for i, a in base.items():
            shape = (len(cuts[i]), len(traces[i].pairs))
            b = a + shape[0] * shape[1]
            sol = flat[a:b].float().view(shape)
            ans = flat[n_out + a : n_out + b].float().view(shape)
            own = flat[n_out + b].float() if traces[i].answer_cut is not None else None
            entropies, greedy = predictions[i]
            results[i] = TraceScores(cuts[i], sol, ans, entropies, own, greedy)
    return results  # type: ignore[return-value]
