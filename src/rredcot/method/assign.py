"""From a batch of traces to token coefficients σ: the credit pipeline shared by the trainer and the CLI.

``CreditAssigner.assign`` takes traces as token ids (prompt, completion), their advantage and their
reference pairs as text, and returns one :class:`TraceCredit` per trace: σ·|o| plus everything it came
from (segments, exit points, values, thought and answer NLLs, entropies). It knows nothing of TRL:
``RREDCoTTrainer`` feeds it the generation batch, ``rredcot credit-view`` feeds it a trace file.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import Any, Literal

import torch

from rredcot.method import credit as C
from rredcot.method import segmentation as S
from rredcot.method.answer_baseline import greedy_answer_log_probs, written_solution
from rredcot.method.forward import model_device
from rredcot.method.scoring.entropies import completion_entropies
from rredcot.method.scoring.naive import score_traces_naive
from rredcot.method.scoring.single_pass import score_traces_single_pass, supports_single_pass
from rredcot.method.scoring.types import ExitStrings, ScoringBudget, TraceExits, TraceScores

_log = logging.getLogger(__name__)


DEFAULT_EXIT_STRING = "</think>\n"
DEFAULT_ANSWER_PREFIX = " \\boxed{"
DEFAULT_ANSWER_SUFFIX = "}"


@dataclass
class MonteCarloSettings:
    """Policy rollouts of the Monte Carlo credit method (``mc``), from every exit point."""

    samples: int = 4
    """Rollouts per exit point (M); each costs one generation of up to ``max_new_tokens`` tokens.
    Exit points with the same prefix (a group's shared prompt, shared first lines) share theirs."""
    max_new_tokens: int | None = None
    """Token budget of a rollout (null: the training run's completion length, so that a rollout can
    always finish what a completion could)."""
    batch_size: int = 64
    """Rollouts generated together in one batch (their KV cache is batch_size x (prompt + trace +
    max_new_tokens) tokens). Batches hold prefixes of similar length; on a CPU small batches waste
    less on rows that finished early (1,536 rollouts of the default model, one thread: 6.7 s in
    batches of 64, 8.7 s of 256, 40.7 s in one), on a GPU larger ones fill the device."""

    def __post_init__(self) -> None:
        if self.samples < 1 or self.batch_size < 1:
            raise ValueError("samples and batch_size must be positive")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be positive (or null)")


@dataclass
class CreditSettings:
    """How credit is computed, whatever the method: the settings every arm of an experiment shares
    (the workflow's ``credit`` section has exactly these keys)."""

    mix: float = 0.5
    """σ = (1-mix)/|o| + mix · (the method's share); 0 gives uniform credit."""
    segmentation: S.SegmentationConfig = field(default_factory=S.SegmentationConfig)
    """Keyword/newline pieces, target number of segments, minimum length, homogenize."""
    group_pairs: bool = False
    """Add the final solutions of the correct completions of the same group as reference pairs."""
    proposal: Literal["uniform", "given"] = "uniform"
    """``uniform`` (q_i = 1/N) or ``given``: the dataset pair's log q from the ``reference_log_q`` column."""
    value_model: Literal["policy", "reference"] = "policy"
    """``policy`` (the model that generated the batch) or ``reference`` (a frozen model of the start)."""
    scorer: Literal["single_pass", "naive"] = "single_pass"
    """``single_pass`` (shared prefix, tree mask) or ``naive`` (one sequence per exit point)."""
    answer_baseline: Literal["greedy", "reference"] = "greedy"
    """What the answer segment's own final solution is compared with at the model's exit: ``greedy``
    (the solution the value model itself would write there, decoded greedily) or ``reference`` (the
    reference solution, no decoding). See ``answer_baseline.py``."""
    value_space: Literal["linear", "log"] = "linear"
    """How a segment's reward is read off the values at its two exit points, for RREDCoT and Monte
    Carlo credit alike: ``linear``, the change of value (expected utility) across it, as the
    redistribution theory has it; ``log``, the change of log value. On the synthetic task a wrong
    trace's culprit step got the largest blame in 94% of the traces with ``linear`` and in 54% with
    ``log`` (docs/METHOD-NOTES.md, "Value differences: linear or log")."""
    precision: Literal["autocast", "float32"] = "autocast"
    """Precision of the credit passes: ``autocast``, the training run's own (bf16 autocast in the
    paper recipes; float32 in the embedded default); ``float32``, autocast off, so that the passes
    run in the float32 master weights. On the embedded default's SFT model, 200 sampled traces, bf16
    changed σ·|o| by up to 0.18 (95th percentile 0.07) and kept the most-blamed segment of 99% of
    them; float32 is exact and, on a GPU, costs several times bf16 (docs/DISTRIBUTED.md,
    "Precision")."""
    budget: ScoringBudget = field(default_factory=ScoringBudget)
    """Memory bounds of the scoring passes."""
    mc: MonteCarloSettings = field(default_factory=MonteCarloSettings)
    """Policy rollouts of the Monte Carlo credit method (``mc``)."""
    view_every: int = 10
    """Keep credit records of a few traces every this many steps for inspection (0: never)."""
    view_samples: int = 2
    """Traces per kept step: alternately one with a negative and one with a positive advantage."""

    @staticmethod
    def read_by(method: C.CreditMethod) -> tuple[str, ...]:
        """The settings (field names) that ``method``'s credit depends on; the others are never read
        on its path, so an experiment that changes only those leaves the method's runs as they were.
        Uniform credit reads none (TRL's advantages stay as they are); every other method weights
        tokens (``mix``), runs forward passes (``budget``) and keeps views; segment methods cut the
        trace (``segmentation``); the Monte Carlo method samples rollouts (``mc``); exit-point values
        are scored against reference pairs with a value model and an answer baseline."""
        if method.uniform:
            return ()
        names = ["mix", "budget", "precision", "view_every", "view_samples"]
        if method.segment_rewards is not None:
            names.append("segmentation")
        if method.needs_rollouts:
            names += ["mc", "value_space"]
        if method.needs_exit_values:
            names += ["group_pairs", "proposal", "value_model", "scorer", "answer_baseline", "value_space"]
        return tuple(names)

    def __post_init__(self) -> None:
        choices = {
            "proposal": ("uniform", "given"),
            "value_model": ("policy", "reference"),
            "scorer": ("single_pass", "naive"),
            "precision": ("autocast", "float32"),
            "answer_baseline": ("greedy", "reference"),
            "value_space": C.VALUE_SPACES,
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.proposal == "given" and self.group_pairs:
            raise ValueError("proposal 'given' covers the dataset pair only; turn group_pairs off")
        if not 0.0 <= self.mix <= 1.0:
            raise ValueError(f"mix must lie in [0, 1], got {self.mix}")
        if self.view_every < 0 or self.view_samples < 1:
            raise ValueError("view_every must be >= 0 and view_samples >= 1")


@dataclass
class CreditConfig(CreditSettings):
    """How the sequence advantage is spread over a completion's tokens: a credit method, the shared
    settings, and the text of an exit (from the prompt format)."""

    method: str = "rredcot"
    """A registered credit method (``credit.CREDIT_METHODS``): ``uniform``, ``rredcot``, ``entropy``,
    ``rredcot+entropy``."""
    exit_string: str = DEFAULT_EXIT_STRING
    """Text that closes the thinking block at an exit point."""
    answer_prefix: str = DEFAULT_ANSWER_PREFIX
    """Text between a reference solution and its answer."""
    answer_suffix: str = DEFAULT_ANSWER_SUFFIX
    """Text after the reference answer."""

    def __post_init__(self) -> None:
        super().__post_init__()
        reads_baseline = C.credit_method(self.method).needs_exit_values  # see read_by
        if reads_baseline and self.answer_baseline == "greedy" and not self.answer_prefix.strip():
            raise ValueError("answer_baseline 'greedy' needs a non-blank answer_prefix to end the solution")

    @property
    def kind(self) -> C.CreditMethod:
        """The registered method."""
        return C.credit_method(self.method)

    @classmethod
    def from_settings(cls, settings: CreditSettings, **rest: Any) -> CreditConfig:
        """The shared settings plus a method and the exit text."""
        return cls(**{f.name: getattr(settings, f.name) for f in fields(CreditSettings)}, **rest)


@dataclass
class TraceCredit:
    """Credit computed for one completion (kept for logging and inspection)."""

    multiplier: torch.Tensor  # σ·|o| over the completion's tokens
    segment_starts: list[int] = field(default_factory=list)
    cuts: list[int] = field(default_factory=list)
    log_values: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    log_p_solution: torch.Tensor = field(default_factory=lambda: torch.empty(0))  # [n_cuts, N]
    log_p_answer: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    entropies: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    # The answer segment after the model's own exit: log of the value after the model's own final
    # solution over the value at the exit (its reward in log space).
    answer_reward: float | None = None
    baseline_solution: list[int] | None = None  # greedy solution at the exit (answer_baseline greedy)
    # r̂ per segment as σ used them (value_space), the answer segment's last; empty for uniform credit.
    segment_rewards: torch.Tensor = field(default_factory=lambda: torch.empty(0))


@dataclass
class TraceInput:
    """One trace to assign credit to."""

    prompt_ids: list[int]
    completion_ids: list[int]
    advantage: float
    pairs: list[tuple[str, str]]  # reference (solution, answer) texts; the dataset pair first
    log_q: torch.Tensor | None = None  # [N] log proposal probabilities (None: uniform)
    utility: torch.Tensor | None = None  # [N] utilities (None: all 1)
    culprit: int | None = None  # oracle credit: token where the trace first goes wrong (None: none)
    outcome: float | None = None  # Monte Carlo credit: the trace's own reward, in [0, 1]


Rollouts = Callable[[torch.nn.Module, list[TraceInput], list[list[int]]], list[list[float]]]
"""How the Monte Carlo method gets its values: ``rollouts(policy, traces, cuts)`` samples
``MonteCarloSettings.samples`` continuations of ``prompt ⊕ completion[:c]`` from the policy for every
cut ``c`` of every trace and returns, per trace and cut, the sum of their rewards (each in [0, 1]).
The caller owns sampling and reward (``RREDCoTTrainer`` uses the run's reward); the method only
turns the sums into values and σ."""


class CreditAssigner:
    """Computes σ for batches of traces with a tokenizer and a :class:`CreditConfig`."""

    def __init__(self, tokenizer: Any, config: CreditConfig) -> None:
        self.tok = tokenizer
        self.cfg = config
        self._token_text: dict[int, str] = {}
        self._encoded: dict[str, list[int]] = {}
        self._warned_naive = False
        self.seconds: dict[str, float] = {}
        """Wall seconds of each pass of the last ``assign`` call: ``entropies``, ``scoring``,
        ``answer_baseline``, ``rollouts`` (the ones the method ran). Every pass ends with its results
        on the host, so on a GPU these are the device's times too."""

    @contextmanager
    def _timed(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0

    def encode(self, text: str) -> list[int]:
        if text not in self._encoded:
            self._encoded[text] = self.tok(text, add_special_tokens=False)["input_ids"]
        return self._encoded[text]

    def token_text(self, token: int) -> str:
        """Decoded text of one token (cached)."""
        if token not in self._token_text:
            self._token_text[token] = self.tok.decode([token])
        return self._token_text[token]

    def token_texts(self, ids: list[int]) -> list[str]:
        """Decoded text of each token (cached per id: decoding one by one is slow)."""
        missing = [t for t in set(ids) if t not in self._token_text]
        if missing:
            texts = self.tok.batch_decode([[t] for t in missing])
            self._token_text.update(zip(missing, texts, strict=True))
        return [self._token_text[t] for t in ids]

    def baseline_text(self, credit: TraceCredit) -> str | None:
        """The greedy final solution a trace's answer segment was judged against, as text."""
        if credit.baseline_solution is None:
            return None
        return "".join(self.token_texts(credit.baseline_solution))

    def strings(self) -> ExitStrings:
        c = self.cfg
        return ExitStrings(
            self.encode(c.exit_string), self.encode(c.answer_prefix), self.encode(c.answer_suffix)
        )

    def final_solution(self, text: str) -> tuple[str, str] | None:
        """(solution, answer) written after the last exit string of a completion, if well formed."""
        c = self.cfg
        at = text.rfind(c.exit_string)
        if at < 0:
            return None
        rest = text[at + len(c.exit_string) :]
        a = rest.rfind(c.answer_prefix)
        b = rest.rfind(c.answer_suffix) if c.answer_suffix else len(rest)
        if a < 0 or b < a + len(c.answer_prefix):
            return None
        return rest[:a], rest[a + len(c.answer_prefix) : b]

    # -- the pipeline ----------------------------------------------------------------------------
    def assign(
        self,
        policy: torch.nn.Module,
        items: list[TraceInput],
        value_model: torch.nn.Module | None = None,
        rollouts: Rollouts | None = None,
    ) -> list[TraceCredit]:
        """σ for every trace. ``policy`` supplies entropies; ``value_model`` (default: the policy) scores;
        ``rollouts`` supplies the Monte Carlo method's outcome sums.

        Models are used as given (the caller puts them in eval mode); nothing needs gradients.
        """
        self.seconds = {}
        if not items:
            return []
        if self.cfg.precision == "float32" and not self.cfg.kind.uniform:
            with torch.autocast(model_device(policy).type, enabled=False):
                return self._assign(policy, items, value_model, rollouts)
        return self._assign(policy, items, value_model, rollouts)

    def _assign(
        self,
        policy: torch.nn.Module,
        items: list[TraceInput],
        value_model: torch.nn.Module | None,
        rollouts: Rollouts | None,
    ) -> list[TraceCredit]:
        cfg, budget = self.cfg, self.cfg.budget
        method = cfg.kind
        if method.uniform:
            return [TraceCredit(torch.ones(len(t.completion_ids)), _one_segment(t)) for t in items]
        pairs_of = [(t.prompt_ids, t.completion_ids) for t in items]
        if method.segment_rewards is None:  # token weighting alone: one forward pass, no scoring
            with self._timed("entropies"):
                ents = completion_entropies(policy, pairs_of, budget)
            return [
                TraceCredit(
                    method.multiplier(len(t.completion_ids), t.advantage, cfg.mix, entropies=h),
                    _one_segment(t),
                    entropies=h,
                )
                for t, h in zip(items, ents, strict=True)
            ]

        texts = [self.token_texts(t.completion_ids) for t in items]
        # Exit points lie in the thinking part only; the last one is where the model itself exits.
        # The answer after it is one more segment (see _trace_credit).
        ends = [S.thinking_end(tx, cfg.exit_string) for tx in texts]
        starts: dict[int, list[int]] = {}

        if method.segment_rewards == "oracle":  # RREDCoT's segments, blame from the task: no scoring
            with self._timed("entropies"):
                ents = completion_entropies(policy, pairs_of, budget)
            out = []
            for j, (t, h) in enumerate(zip(items, ents, strict=True)):
                self._segment(j, h, items, texts, ends, starts)
                out.append(self._oracle_credit(t, starts[j], ends[j], h))
            return out

        if method.segment_rewards == "mc_values":  # RREDCoT's exit points, values from rollouts
            if rollouts is None:
                raise ValueError(
                    f"credit method {method.name!r} needs rollouts= (policy rollouts and rewards)"
                )
            with self._timed("entropies"):
                ents = completion_entropies(policy, pairs_of, budget)
            cuts = [self._segment(j, h, items, texts, ends, starts) for j, h in enumerate(ents)]
            with self._timed("rollouts"):
                sums = rollouts(policy, items, cuts)
            if len(sums) != len(items) or any(len(s) != len(c) for s, c in zip(sums, cuts, strict=True)):
                raise ValueError("rollouts must return one outcome sum per cut of every trace")
            return [
                self._mc_credit(t, starts[j], ends[j], cuts[j], sums[j], ents[j]) for j, t in enumerate(items)
            ]

        def cuts_for(j: int, entropies: torch.Tensor) -> list[int]:
            return self._segment(j, entropies, items, texts, ends, starts)

        specs = [
            TraceExits(
                t.prompt_ids,
                t.completion_ids,
                None,
                [(self.encode(u) if u else [], self.encode(y)) for u, y in t.pairs],
                self._own_answer_cut(t.completion_ids, texts[j], ends[j]),
            )
            for j, t in enumerate(items)
        ]
        value_model = value_model if value_model is not None else policy
        ents = None
        if value_model is not policy:
            # Segment by the policy's entropies, score with the frozen value model.
            with self._timed("entropies"):
                ents = completion_entropies(policy, pairs_of, budget)
            specs = [
                TraceExits(s.prompt_ids, s.completion_ids, cuts_for(j, ents[j]), s.pairs, s.answer_cut)
                for j, s in enumerate(specs)
            ]
        with self._timed("scoring"):
            if self._single_pass(value_model):
                scores = score_traces_single_pass(value_model, specs, self.strings(), budget, cuts_for)
            else:
                scores = score_traces_naive(value_model, specs, self.strings(), budget, cuts_for)
        if ents is not None:
            scores = [
                TraceScores(
                    sc.cuts, sc.log_p_solution, sc.log_p_answer, ents[j], sc.log_p_own_answer, sc.greedy_ids
                )
                for j, sc in enumerate(scores)
            ]
        baselines = [None] * len(items)
        if cfg.answer_baseline == "greedy":
            with self._timed("answer_baseline"):
                baselines = self._greedy_baselines(value_model, items, texts, ends, specs, scores)
        return [
            self._trace_credit(items[j], starts[j], ends[j], sc, baselines[j]) for j, sc in enumerate(scores)
        ]

    def _segment(
        self,
        j: int,
        entropies: torch.Tensor,
        items: list[TraceInput],
        texts: list[list[str]],
        ends: list[int | None],
        starts: dict[int, list[int]],
    ) -> list[int]:
        """Segment trace ``j``'s thinking (into ``starts[j]``) and return its exit cuts."""
        completion, end = items[j].completion_ids, ends[j]
        if end is not None:
            starts[j] = S.segment_trace(texts[j][:end], entropies[:end].tolist(), self.cfg.segmentation)
            return S.exit_cuts(starts[j], end) if end > 0 else [0]
        # No exit of its own (e.g. cut off at the length limit): the final exit follows the whole
        # trace but not its EOS (nothing is read after EOS, and a segment never starts at the EOS:
        # it joins the last segment), so cuts stay increasing.
        found = S.segment_trace(texts[j], entropies.tolist(), self.cfg.segmentation)
        eos = self.tok.eos_token_id
        scored = len(completion) - 1 if completion and completion[-1] == eos else len(completion)
        starts[j] = [s for s in found if s < scored] or [0]
        return [min(c, scored) for c in S.exit_cuts(starts[j], len(completion))]

    def _oracle_credit(
        self, item: TraceInput, starts: list[int], answer_at: int | None, entropies: torch.Tensor
    ) -> TraceCredit:
        """Perfect blame on RREDCoT's segments (thinking segments, then the answer segment)."""
        n = len(item.completion_ids)
        if answer_at is not None and answer_at < n:
            starts = [s for s in starts if s < answer_at] + [answer_at]
        starts = starts or [0]
        culprit = None
        if item.culprit is not None:
            if not 0 <= item.culprit < n:
                raise ValueError(f"culprit token {item.culprit} outside the {n}-token completion")
            culprit = max(k for k, s in enumerate(starts) if s <= item.culprit)
        rewards = C.oracle_segment_rewards(len(starts), culprit)
        ids = S.segment_ids_from_starts(starts, n)
        mult = self.cfg.kind.multiplier(n, item.advantage, self.cfg.mix, ids, rewards)
        answer_reward = float(rewards[-1]) if answer_at is not None and answer_at < n else None
        return TraceCredit(
            mult, starts, entropies=entropies, answer_reward=answer_reward, segment_rewards=rewards
        )

    def _mc_credit(
        self,
        item: TraceInput,
        starts: list[int],
        answer_at: int | None,
        cuts: list[int],
        sums: list[float],
        entropies: torch.Tensor,
    ) -> TraceCredit:
        """Monte Carlo values at RREDCoT's exit points, through RREDCoT's segment-reward-to-σ mapping.

        The thinking segments earn the change of value from ``cut_k`` to ``cut_{k+1}``
        (``value_space``); the answer segment after the model's own exit earns the trace's own
        outcome against the value at that exit (the outcome counted as ``samples`` equal rollouts,
        so both sides carry the same smoothing)."""
        n, m = len(item.completion_ids), self.cfg.mc.samples
        log_v = C.mc_log_values(sums, m)
        answer_reward = None
        if answer_at is not None and answer_at < n:
            if item.outcome is None or not 0.0 <= item.outcome <= 1.0:
                raise ValueError(
                    f"Monte Carlo credit needs each trace's outcome in [0, 1], got {item.outcome}"
                )
            answer_reward = float(C.mc_log_values([item.outcome * m], m)[0] - log_v[-1])
            starts = [*starts, answer_at]
        rewards = C.value_rewards(log_v, self.cfg.value_space, answer_reward)
        ids = S.segment_ids_from_starts(starts, n)
        mult = self.cfg.kind.multiplier(n, item.advantage, self.cfg.mix, ids, rewards)
        return TraceCredit(
            mult,
            starts,
            cuts,
            log_v,
            entropies=entropies,
            answer_reward=answer_reward,
            segment_rewards=rewards,
        )

    def _greedy_baselines(
        self,
        model: torch.nn.Module,
        items: list[TraceInput],
        texts: list[list[str]],
        ends: list[int | None],
        specs: list[TraceExits],
        scores: list[TraceScores],
    ) -> list[_Baseline | None]:
        """Per trace with an answer segment: its greedy final solution and log p(y_ref | it, s_e).

        The solution starts after the token holding the end of the model's own exit string. The
        scoring pass already knows the model's most likely token at every completion position, so
        as long as the trace follows it, greedy decoding would write the trace's own tokens: a trace
        whose whole final solution (up to its answer prefix) does so is faithful and needs no decoding.
        The others decode from their first departure; identical heads with the same answer decode once.
        """
        needle = self.cfg.answer_prefix.strip()
        exit_needle = self.cfg.exit_string.strip()
        eos = self.tok.eos_token_id

        def stop_at(solution: list[int]) -> int | None:
            # Asked after every token the solution grows by (answer_baseline._write): only the
            # tokens the needle can span back from the last one are read.
            first, reach = len(solution) - 1, len(needle) - 1
            while first > 0 and reach > 0:
                first -= 1
                reach -= len(self.token_text(solution[first]))
            found = S.find_text_at_end(self.token_texts(solution[first:]), needle)
            return None if found is None else first + found

        starts = {
            j: _exit_end(texts[j], ends[j], exit_needle)
            for j, spec in enumerate(specs)
            if ends[j] is not None and spec.answer_cut is not None
        }
        out: list[_Baseline | None] = [None] * len(items)
        if not starts:
            return out
        # Room for a solution twice the longest own one: a greedy solution that has not ended by
        # then is cut there and the answer forced after it.
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
            # Decode from the first departure; if greedy decoding would already have ended before
            # it (rare: an earlier answer prefix or EOS), from the start of the solution.
            resume = agree if written is None else start
            head = (*items[j].prompt_ids, *completion[:resume])
            key = (head, tuple(specs[j].pairs[0][1]), len(items[j].prompt_ids) + start)
            jobs.setdefault(key, []).append(j)
            # Greedy decoding replaces the token at the departure and often writes on as the trace
            # did: the trace's continuation is the draft the decoder checks.
            drafts.setdefault(key, completion[resume + 1 :])
        if not jobs:
            return out
        keys = list(jobs)
        log_p, solutions = greedy_answer_log_probs(
            model,
            [list(k[0]) for k in keys],
            [list(k[1]) for k in keys],
            self.encode(self.cfg.answer_prefix),
            self.encode(self.cfg.answer_suffix),
            stop_at,
            [eos],
            max_new,
            solution_starts=[k[2] for k in keys],
            budget=self.cfg.budget,
            drafts=[drafts[k] for k in keys],
        )
        for k, lp, solution in zip(keys, log_p.tolist(), solutions, strict=True):
            for j in jobs[k]:
                out[j] = _Baseline(lp, solution, owns[j] == solution)
        return out

    def _single_pass(self, model: torch.nn.Module) -> bool:
        """Whether to score with the single-pass scorer: configured, and the model supports it.

        A model whose cache cannot be cut at an exit point (sliding-window, linear-attention or
        state-space layers) or whose attention ignores 4D masks is scored naively, said once."""
        if self.cfg.scorer != "single_pass":
            return False
        if supports_single_pass(model):
            return True
        if not self._warned_naive:
            impl = getattr(model.config, "_attn_implementation", None)
            _log.warning(
                "single-pass scoring needs eager or sdpa attention and a plain key/value cache in every "
                "layer; %s (attention %r) has neither or not both, so its exit points are scored naively "
                "(one sequence per exit point: same values, about K/2 times the tokens)",
                type(model).__name__,
                impl,
            )
            self._warned_naive = True
        return False

    def _own_answer_cut(self, completion: list[int], texts: list[str], end: int | None) -> int | None:
        """Where the model's own final solution ends: its last answer prefix after the exit, else the
        end of the trace before its EOS. None when the model never exits (no answer segment)."""
        if end is None or end >= len(completion):
            return None
        needle = self.cfg.answer_prefix.strip() or self.cfg.answer_prefix
        box = S.find_text(texts, needle, start=end, last=True) if needle else None
        if box is not None:
            return box
        eos = self.tok.eos_token_id
        return len(completion) - 1 if completion[-1] == eos else len(completion)

    def _trace_credit(
        self,
        item: TraceInput,
        starts: list[int],
        answer_at: int | None,
        scores: TraceScores,
        baseline: _Baseline | None = None,
    ) -> TraceCredit:
        n = len(item.completion_ids)
        log_v = C.exit_log_values(scores.log_p_solution, scores.log_p_answer, item.log_q, item.utility)
        answer_reward = None
        if answer_at is not None and answer_at < n:
            # The answer segment's reward compares how well the model's own final solution and a
            # baseline solution, both read at the model's exit, lead to the reference answer:
            # r̂ = log p(y | own solution, s_e) - log p(y | baseline, s_e). Both are answer NLLs, so
            # no solution's (large) likelihood leaks into it. With the greedy baseline a faithful
            # solution (the one the model expects to write there) gets 0 and a slip the blame; with
            # the reference solution a faithful copy of a wrong thought is blamed too.
            starts = [*starts, answer_at]
            if baseline is None:
                answer_reward = float(scores.log_p_own_answer - scores.log_p_answer[-1, 0])
            elif baseline.is_own:  # the same text scored twice: exactly 0, not float round-off
                answer_reward = 0.0
            else:
                answer_reward = float(scores.log_p_own_answer) - baseline.log_p_answer
            answer_reward = max(answer_reward, C.LOG_VALUE_FLOOR)
        rewards = C.value_rewards(log_v, self.cfg.value_space, answer_reward)
        ids = S.segment_ids_from_starts(starts, n)
        ents = scores.entropies if self.cfg.kind.token_weights == "entropy" else None
        mult = self.cfg.kind.multiplier(n, item.advantage, self.cfg.mix, ids, rewards, ents)
        return TraceCredit(
            mult,
            starts,
            scores.cuts,
            log_v,
            scores.log_p_solution,
            scores.log_p_answer,
            scores.entropies,
            answer_reward,
            baseline.solution if baseline is not None else None,
            rewards,
        )


@dataclass(frozen=True)
class _Baseline:
    """The greedy final solution at a trace's exit and how well it leads to the reference answer."""

    log_p_answer: float  # log p(y_ref | greedy solution, s_e)
    solution: list[int]
    is_own: bool  # the trace's own final solution is exactly this one


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


def _one_segment(item: TraceInput) -> list[int]:
    """Segment starts of a method without segments: the whole trace is one segment."""
    return [0] if item.completion_ids else []


def credit_record(
    tokens: list[str],
    credit: TraceCredit,
    method: str,
    step: int | None,
    trace_id: str,
    prompt: str,
    answer: str,
    advantage: float,
    reward: float | None = None,
    baseline_text: str | None = None,
) -> dict[str, Any]:
    """A JSON-ready description of one trace's credit (the input of ``rredcot.viz.credit_view``)."""

    def finite(x: torch.Tensor) -> list[float | None]:
        return [float(v) if math.isfinite(float(v)) else None for v in x.flatten().tolist()]

    n = len(tokens)
    sigma = (credit.multiplier[:n].double() / max(n, 1)).tolist()
    first = (lambda t: -t[:, 0]) if credit.log_p_solution.dim() == 2 else (lambda t: t)
    return {
        "trace_id": trace_id,
        "step": step,
        "method": method,
        "prompt": prompt,
        "answer": answer,
        "reward": reward if reward is not None else float(advantage > 0),
        "advantage": advantage,
        "tokens": tokens,
        "sigma": sigma,
        "segment_starts": list(credit.segment_starts),
        "cuts": list(credit.cuts),
        "log_values": finite(credit.log_values),
        "thought_nll": finite(first(credit.log_p_solution)) if credit.log_p_solution.numel() else None,
        "answer_nll": finite(first(credit.log_p_answer)) if credit.log_p_answer.numel() else None,
        "entropies": [float(h) for h in credit.entropies.tolist()],
        "answer_reward": credit.answer_reward,
        "answer_baseline": baseline_text,
    }
