"""The registries of reward sources and credit methods (docs/library.md, "Adding a credit method").

A credit method spreads a trace's advantage over its tokens. It is two choices:

- a **reward source**: the function that gives each segment of a trace its reward. It is registered
  with what it reads of the credit settings and what the caller must supply, beside the function::

      @register_reward_source("oracle", needs=("culprit",))
      def oracle(assigner, batch: Batch) -> list[SegmentRewards]: ...

  A source that segments the trace cuts it with ``assigner.segment`` (thinking segments, then the
  answer after the model's own exit) and returns one reward per segment;
- a **token weighting**: a segment's share spread uniformly over its tokens, or by their entropy.

A method has one of two forms. ``share`` (every built-in method but SPO-chain): σ_t, a non-negative
share of the trace's GRPO advantage A, and token t's advantage is A·σ_t·|o|; ``CreditMethod
.multiplier`` turns the rewards into ``σ·|o|``. ``advantage``: the method gives every token an
advantage of its own (``SegmentRewards.advantages``, signed, in the method's units) and A is not
multiplied in: SPO-chain's segment advantages V(end) − V(start), which a share of A cannot express
(a right trace's segment can lose value, a wrong trace's gain it), and PRIME's token advantages.
``CreditSettings.read_by`` and the TRL adapter read ``reads`` and ``needs`` from the registered source.
The built-in sources and methods live in ``rredcot.method.sources`` (one module each); a new one is
one more registered function.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor

from rredcot.method import credit as C

if TYPE_CHECKING:
    from rredcot.method.answer_baseline import SolutionDecoder


@dataclass
class TraceInput:
    """One trace to assign credit to, and what the caller knows of it."""

    prompt_ids: list[int]
    completion_ids: list[int]
    advantage: float
    pairs: list[tuple[str, str]]  # reference (solution, answer) texts; the dataset pair first
    log_q: Tensor | None = None  # [N] log proposal probabilities (None: uniform)
    utility: Tensor | None = None  # [N] utilities (None: all 1)
    culprit: int | None = None
    """Character offset in the completion's text (its tokens' texts joined,
    ``CreditAssigner.completion_text``) where it first goes wrong; None: nowhere (the ``culprit``
    need)."""
    outcome: float | None = None  # the trace's own reward in [0, 1] (the ``outcome`` need)
    task_values: Callable[[list[int]], list[float]] | None = None
    """The trace's values at character offsets of its completion text, computed by the task itself
    (``rredcot.data.synthetic.exact_values``); the ``task_values`` need."""
    prm_log_probs: Tensor | None = None
    """log π_PRM(o_t | prompt, o_<t) of every completion token under an implicit process reward
    model (float, one per token; the ``process_log_probs`` need, with ``ref_log_probs`` and
    ``group``)."""
    ref_log_probs: Tensor | None = None
    """The same tokens' log-probabilities under the frozen reference the PRM is measured against."""
    group: int | None = None
    """The trace's group (the completions of one prompt): the traces of a group are consecutive
    items and every group has as many (the trainer's ``num_generations``)."""


Rollouts = Callable[[torch.nn.Module, list[TraceInput], list[list[int]]], list[list[float]]]
"""The ``rollouts`` need: ``rollouts(policy, traces, cuts)`` samples ``MonteCarloSettings.samples`` (of
the method's section, ``CreditConfig.rollout_settings``: ``mc``, or ``spo`` for SPO-chain)
continuations of ``prompt ⊕ completion[:c]`` from the policy for every cut ``c`` of every trace and
returns, per trace and cut, the sum of their rewards (each in [0, 1]). The caller owns sampling and
reward (``rredcot.lm.rollouts.PolicyRollouts``); the method turns the sums into values and σ."""


@dataclass
class Batch:
    """What a reward source reads: the traces, their token texts and where each exits, the models,
    what the caller supplied, and (filled by ``assigner.segment``) each trace's segment starts."""

    items: list[TraceInput]
    texts: list[list[str]]  # decoded text of every completion token
    ends: list[int | None]  # token where each trace's own exit string begins (None: it never exits)
    policy: torch.nn.Module
    value_model: torch.nn.Module  # the policy unless a frozen one is given
    rollouts: Rollouts | None = None
    decoder: SolutionDecoder | None = None  # greedy decoding by an engine holding the policy's weights
    starts: dict[int, list[int]] = field(default_factory=dict)  # thinking segment starts per trace
    entropies: list[Tensor] | None = None  # the policy's token entropies, once computed


@dataclass
class SegmentRewards:
    """A reward source's answer for one trace: a reward per segment and what it came from."""

    rewards: Tensor  # float64, one per segment: thinking segments, then the answer segment
    starts: list[int]  # token where each segment starts
    entropies: Tensor = field(default_factory=lambda: torch.empty(0))
    cuts: list[int] = field(default_factory=list)  # exit points the values were read at
    log_values: Tensor = field(default_factory=lambda: torch.empty(0))
    log_p_solution: Tensor = field(default_factory=lambda: torch.empty(0))  # [n_cuts, N]
    log_p_answer: Tensor = field(default_factory=lambda: torch.empty(0))
    answer_reward: float | None = None  # the answer segment's reward before value_space, if any
    baseline_solution: list[int] | None = None  # greedy solution at the exit (answer_baseline greedy)
    advantages: Tensor | None = None
    """A method of the ``advantage`` form: the advantage of every completion token (float32), which
    the trainer applies as it is; None for ``share`` methods."""


RewardFn = Callable[[Any, Batch], list[SegmentRewards]]
"""``fn(assigner, batch)``: the segment rewards of every trace of the batch, in order. ``assigner``
is the ``CreditAssigner`` (settings ``cfg``, ``entropies``, ``segment``, ``encode``, ...)."""


@dataclass(frozen=True)
class RewardSource:
    """A registered reward source: the function, and what it reads and needs."""

    name: str
    fn: RewardFn
    reads: tuple[str, ...]
    """``CreditSettings`` fields the source reads, beyond those every credit method reads."""
    needs: tuple[str, ...]
    """What the caller supplies: ``reference_pairs`` (``TraceInput.pairs``), ``culprit``,
    ``outcome``, ``task_values`` (``TraceInput`` fields), ``rollouts`` (``assign(rollouts=...)``),
    ``process_log_probs`` (``TraceInput.prm_log_probs``, ``ref_log_probs`` and ``group``: an implicit
    process reward model's and its reference's token log-probabilities, every completion of each
    group)."""
    segments: bool
    """Whether the source cuts the trace with the shared segmentation at exit points (and so reads
    ``segmentation``); SPO-chain cuts its own segments, by token probability, and does not."""
    description: str


NEEDS = ("reference_pairs", "culprit", "outcome", "rollouts", "task_values", "process_log_probs")
REWARD_SOURCES: dict[str, RewardSource] = {}
"""Reward sources by name (``register_reward_source`` adds one)."""


def register_reward_source(
    name: str, *, reads: tuple[str, ...] = (), needs: tuple[str, ...] = (), segments: bool = True
) -> Callable[[RewardFn], RewardFn]:
    """Register the decorated function as the reward source ``name`` (its docstring describes it)."""
    unknown = sorted(set(needs) - set(NEEDS))
    if unknown:
        raise ValueError(f"reward source {name!r}: unknown needs {unknown}; known: {', '.join(NEEDS)}")

    def register(fn: RewardFn) -> RewardFn:
        if name in REWARD_SOURCES:
            raise ValueError(f"reward source {name!r} is registered already")
        doc = (fn.__doc__ or "").strip().split("\n\n")[0]
        REWARD_SOURCES[name] = RewardSource(name, fn, tuple(reads), tuple(needs), segments, doc)
        return fn

    return register


@dataclass(frozen=True)
class CreditMethod:
    """One way of spreading a trace's advantage over its tokens (σ): a reward source and a token
    weighting, looked up by name. Every method gives non-negative, finite σ summing to 1 per trace;
    a method of the ``advantage`` form gives token advantages too, and its σ is their share
    (:func:`advantage_shares`)."""

    name: str
    source: str
    """The registered reward source (``none``: no segments)."""
    token_weights: Literal["entropy"] | None
    """Within a segment (or the trace), weight tokens by the policy's entropy, or uniformly (None)."""
    description: str
    form: Literal["share", "advantage"] = field(default="share", kw_only=True)
    """``share``: σ_t is a share of the trace's GRPO advantage A (token advantage A·σ_t·|o|);
    ``advantage``: the method gives every token its own advantage (``SegmentRewards.advantages``) and
    A is not multiplied in."""

    def __post_init__(self) -> None:
        if self.form not in ("share", "advantage"):
            raise ValueError(f"credit method {self.name!r}: form must be 'share' or 'advantage'")

    @property
    def reward_source(self) -> RewardSource:
        try:
            return REWARD_SOURCES[self.source]
        except KeyError:
            raise ValueError(f"credit method {self.name!r}: no reward source {self.source!r}") from None

    @property
    def uniform(self) -> bool:
        """σ = 1/|o| (stock GRPO): nothing to compute, TRL's advantages stay as they are."""
        return self.form == "share" and not self.reward_source.segments and self.token_weights is None

    @property
    def needs(self) -> tuple[str, ...]:
        """What the caller supplies (``NEEDS``; none for uniform credit): ask ``"culprit" in
        method.needs``, in the words the source was registered with."""
        return () if self.uniform else self.reward_source.needs

    @torch.no_grad()
    def multiplier(
        self,
        n_tokens: int,
        advantage: float,
        mix: float,
        segment_ids: Tensor | None = None,
        segment_rewards: Tensor | None = None,
        entropies: Tensor | None = None,
    ) -> Tensor:
        """``σ·|o|`` (float32, length ``n_tokens``) of one trace; exactly 1.0 for uniform. For the
        ``advantage`` form, ``segment_rewards`` are the segments' advantages and σ is each token's
        share of their absolute sum (:func:`advantage_shares`); ``advantage`` and ``mix`` do not enter."""
        if self.uniform or n_tokens == 0:
            return torch.ones(n_tokens, dtype=torch.float32)
        if self.form == "advantage":
            if segment_ids is None or segment_rewards is None:
                raise ValueError(f"credit method {self.name!r} needs segment ids and segment advantages")
            ids = torch.as_tensor(segment_ids, dtype=torch.long)
            if ids.numel() != n_tokens:
                raise ValueError("segment_ids must have one entry per token")
            return advantage_shares(torch.as_tensor(segment_rewards, dtype=torch.float64)[ids])
        if entropies is not None and torch.as_tensor(entropies).numel() != n_tokens:
            raise ValueError(f"{torch.as_tensor(entropies).numel()} entropies for {n_tokens} tokens")
        if self.token_weights == "entropy" and entropies is None:
            raise ValueError(f"credit method {self.name!r} needs token entropies")
        if not self.reward_source.segments:
            return C.entropy_multiplier(entropies, mix)
        if segment_ids is None or segment_rewards is None:
            raise ValueError(f"credit method {self.name!r} needs segment ids and segment rewards")
        if torch.as_tensor(segment_ids).numel() != n_tokens:
            raise ValueError("segment_ids must have one entry per token")
        weights = None if self.token_weights is None else torch.as_tensor(entropies, dtype=torch.float64)
        return C.token_multiplier(segment_ids, segment_rewards, advantage, mix, token_weights=weights)


@torch.no_grad()
def advantage_shares(advantages: Tensor) -> Tensor:
    """``σ·|o|`` (float32) of token advantages: token t's share ``|a_t| / Σ_s |a_s|`` of the trace's
    absolute advantage, times |o|; 1.0 everywhere when every advantage is 0. How much of an
    ``advantage``-form method's credit sits on each token, read as σ is for the ``share`` form (the
    credit statistics and views)."""
    a = torch.as_tensor(advantages, dtype=torch.float64).abs()
    n, total = a.numel(), float(a.sum())
    if n == 0 or total == 0.0 or not math.isfinite(total):
        return torch.ones(n, dtype=torch.float32)
    return (a * (n / total)).float()


CREDIT_METHODS: dict[str, CreditMethod] = {}
"""The registry of credit methods, by name (``register_credit_method`` adds one)."""


def register_credit_method(method: CreditMethod) -> CreditMethod:
    """Add a credit method to the registry (its name must be new)."""
    if method.name in CREDIT_METHODS:
        raise ValueError(f"credit method {method.name!r} is registered already")
    CREDIT_METHODS[method.name] = method
    return method


def credit_method(name: str) -> CreditMethod:
    """The registered credit method called ``name``."""
    try:
        return CREDIT_METHODS[name]
    except KeyError:
        raise ValueError(
            f"unknown credit method {name!r}; expected one of {', '.join(CREDIT_METHODS)}"
        ) from None


def credit_multiplier(
    method: str,
    n_tokens: int,
    advantage: float,
    mix: float,
    segment_ids: Tensor | None = None,
    segment_rewards: Tensor | None = None,
    entropies: Tensor | None = None,
) -> Tensor:
    """``σ·|o|`` (float32, length ``n_tokens``) of one trace under the named credit method
    (:meth:`CreditMethod.multiplier`): methods with segment rewards need ``segment_ids`` and
    ``segment_rewards``, entropy-weighted ones ``entropies`` (bits, one per token)."""
    return credit_method(method).multiplier(n_tokens, advantage, mix, segment_ids, segment_rewards, entropies)
