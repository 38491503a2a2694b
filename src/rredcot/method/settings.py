"""The settings of credit assignment: what every training method of an experiment shares
(``CreditSettings``, the workflow's ``credit`` section) and one method's full configuration
(``CreditConfig``: a registered credit method, the shared settings and the text around an exit
point). Each default is written here
once; the workflow's config tree embeds these classes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from numbers import Real
from typing import Any, Literal

from rredcot.method import segmentation as S
from rredcot.method.credit import VALUE_SPACES
from rredcot.method.registry import CreditMethod, credit_method
from rredcot.method.scoring.types import ScoringBudget

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
    less on rows that finished early, so 64 is quicker there than larger batches
    (docs/results.md#credit-cost-on-a-cpu); on a GPU larger ones fill the device."""

    def __post_init__(self) -> None:
        if self.samples < 1 or self.batch_size < 1:
            raise ValueError("samples and batch_size must be positive")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be positive (or null)")


@dataclass
class SpoSettings(MonteCarloSettings):
    """SPO-chain (``spo``; Segment Policy Optimization, arXiv 2505.23564): where it cuts a trace into
    segments and how it estimates their values, with SPO-chain's own defaults (docs/method.md,
    "SPO-chain"). A completion token whose probability under the policy is below ``threshold`` is a
    cutpoint; a segment boundary falls at every ``interval``-th cutpoint, from the first; ``samples``
    rollouts from each boundary estimate its value."""

    samples: int = 9
    """Rollouts per segment boundary (K; SPO-chain's 9). Boundaries with the same prefix (a group's
    shared prompt) share theirs."""
    threshold: float = field(default=0.9, metadata={"minimum": 0.0, "maximum": 1.0})
    """A completion token whose probability under the policy is below this is a cutpoint (SPO's 0.9);
    only cutpoints carry a policy gradient (SPO's probability mask)."""
    interval: int = 5
    """A segment boundary at every this many cutpoints, from the first (SPO-chain's int5)."""
    min_boundaries: int = 1
    """Boundaries a trace with cutpoints gets at least: where every ``interval``-th cutpoint gives
    fewer, the interval shrinks until it gives this many (or every cutpoint is a boundary). 1 is
    SPO-chain as published (a trace with a cutpoint always has its first one as a boundary)."""
    whiten: bool = True
    """Whiten the token advantages over the cutpoints of all traces of a credit batch (mean 0,
    variance 1), as SPO's trainer whitens advantages before its policy loss."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"spo threshold must lie in [0, 1], got {self.threshold}")
        if self.interval < 1 or self.min_boundaries < 1:
            raise ValueError("spo interval and min_boundaries must be positive")


@dataclass
class PrimeSettings:
    """PRIME (``prime``; Process Reinforcement through IMplicit rEwards, arXiv 2502.01456): the implicit
    process reward model's token rewards, how they are combined with the outcome into token
    advantages, and the PRM's own optimizer, with PRIME's defaults (docs/method.md, "PRIME"). The
    PRM is a trainable copy of the model RL starts from, updated once per generation batch on its
    completions' outcomes; its token reward is ``beta·(log π_PRM − log π_ref)``."""

    beta: float = field(default=0.05, metadata={"exclusiveMinimum": 0.0})
    """β of the implicit reward β·log(π_PRM/π_ref), in the PRM's loss and its token rewards (PRIME's
    ``beta_train``). With ``normalise`` on, the advantages do not depend on it; the PRM's loss does."""
    granularity: Literal["token", "whole"] = "token"
    """``token``: every completion token gets its own process reward (PRIME's default); ``whole``: the
    trace's summed reward sits on its last token."""
    normalise: bool = True
    """Divide the process rewards by the largest process return of the batch in magnitude (PRIME's
    ``batch_norm``), so that none exceeds 1."""
    process_coef: float = field(default=1.0, metadata={"minimum": 0.0})
    """Weight of the process returns in the token advantages (PRIME's estimator sums both returns
    unweighted)."""
    outcome_coef: float = field(default=1.0, metadata={"minimum": 0.0})
    """Weight of the outcome's leave-one-out return in the token advantages."""
    process_gamma: float = field(default=1.0, metadata={"minimum": 0.0, "maximum": 1.0})
    """Discount of the process rewards' returns (PRIME's ``reward_model_gamma``)."""
    outcome_gamma: float = field(default=1.0, metadata={"minimum": 0.0, "maximum": 1.0})
    """Discount of the outcome's return from the last token back (PRIME's ``verifier_gamma``)."""
    whiten: bool = True
    """Whiten the token advantages over every completion token of the batch (mean 0, variance 1), as
    PRIME's trainer does before its policy loss."""
    lr: float | None = field(default=None, metadata={"exclusiveMinimum": 0.0})
    """The PRM's AdamW learning rate (constant, no warmup). None: twice the policy's, PRIME's ratio
    (its PRM at 1e-6 beside a policy at 5e-7), so that the PRM learns at the pace of the policy it
    scores whatever the scale of the run (``prm_learning_rate``)."""
    weight_decay: float = field(default=0.0, metadata={"minimum": 0.0})
    """The PRM's AdamW weight decay (PRIME's 0)."""
    grad_clip: float = field(default=10.0, metadata={"exclusiveMinimum": 0.0})
    """The PRM's gradient norm is clipped to this before each step (PRIME's 10)."""

    def __post_init__(self) -> None:
        if self.beta <= 0 or (self.lr is not None and self.lr <= 0) or self.grad_clip <= 0:
            raise ValueError("prime beta, lr and grad_clip must be positive")
        if self.granularity not in ("token", "whole"):
            raise ValueError(f"prime granularity must be 'token' or 'whole', got {self.granularity!r}")
        if min(self.process_coef, self.outcome_coef, self.weight_decay) < 0:
            raise ValueError("prime process_coef, outcome_coef and weight_decay must be non-negative")
        if not (0.0 <= self.process_gamma <= 1.0 and 0.0 <= self.outcome_gamma <= 1.0):
            raise ValueError("prime process_gamma and outcome_gamma must lie in [0, 1]")


PRM_LR_RATIO = 2.0
"""PRIME's PRM learning rate over its policy's (1e-6 against 5e-7)."""


def prm_learning_rate(settings: PrimeSettings, policy_lr: float) -> float:
    """The learning rate of PRIME's reward model: ``settings.lr``, else ``PRM_LR_RATIO`` times the
    policy's."""
    if settings.lr is not None:
        return float(settings.lr)
    if policy_lr <= 0:
        raise ValueError(f"prime lr null needs the policy's learning rate, got {policy_lr}")
    return PRM_LR_RATIO * float(policy_lr)


@dataclass
class CreditSettings:
    """How credit is computed, whatever the method: the settings every training method of an
    experiment shares (the workflow's ``credit`` section has exactly these keys)."""

    mix: float = field(default=0.5, metadata={"minimum": 0.0, "maximum": 1.0})  # checked at config load
    """σ_t = (1-mix)/|o| + mix · (the method's share of token t); 0 gives uniform credit (σ·|o| = 1
    for every token)."""
    segmentation: S.SegmentationConfig = field(default_factory=S.SegmentationConfig)
    """Keyword/newline pieces, target number of segments, minimum length, homogenize."""
    group_pairs: bool = False
    """Add the final solutions of the correct completions of the same group as reference pairs."""
    proposal: Literal["uniform", "given"] = "uniform"
    """``uniform`` (q_i = 1/N) or ``given``: the dataset pair's log q from the ``reference_log_q`` column."""
    value_model: Literal["policy", "reference"] = "policy"
    """``policy`` (the model that generated the batch) or ``reference`` (a frozen copy of the model
    RL starts from: the SFT model, or the pretrained one)."""
    scorer: Literal["single_pass", "naive"] = "single_pass"
    """``single_pass`` (shared prefix, tree mask) or ``naive`` (one sequence per exit point)."""
    answer_baseline: Literal["greedy", "reference"] = "greedy"
    """What the answer segment's own final solution is compared with at the model's exit: ``greedy``
    (the solution the value model itself would write there, decoded greedily) or ``reference`` (the
    reference solution, no decoding). See ``answer_baseline.py``."""
    value_space: Literal["linear", "log"] = "linear"
    """How a segment's reward is read off the values at its two exit points, for RREDCoT, Monte Carlo
    and exact-values credit alike: ``linear``, the change of value (expected utility) across it, as the
    redistribution theory has it; ``log``, the change of log value. On the synthetic task
    ``linear`` gives a wrong trace's first wrong step the largest blame far more often than ``log``
    (docs/method.md, "Value differences")."""
    precision: Literal["autocast", "float32"] = "autocast"
    """Precision of the credit passes: ``autocast``, the training run's own (bf16 autocast in the
    paper recipes; float32 in the default config); ``float32``, autocast off, so that the passes
    run in the float32 master weights. bf16 moves σ·|o| (σ_t times the trace length) a little and
    almost never changes which segment is blamed most; float32 is exact and, on a GPU, costs
    several times bf16 (docs/distributed.md, "Precision")."""
    budget: ScoringBudget = field(default_factory=ScoringBudget)
    """Memory bounds of the scoring passes."""
    mc: MonteCarloSettings = field(default_factory=MonteCarloSettings)
    """Policy rollouts of the Monte Carlo credit method (``mc``)."""
    spo: SpoSettings = field(default_factory=SpoSettings)
    """SPO-chain's cutpoints, segment boundaries and rollouts (``spo``)."""
    prime: PrimeSettings = field(default_factory=PrimeSettings)
    """PRIME's implicit process rewards, their combination with the outcome, and the PRM's optimizer
    (``prime``)."""
    view_every: int = 10
    """Keep credit records of a few traces every this many steps for inspection (0: never)."""
    view_samples: int = 2
    """Traces per kept step: alternately one with a negative and one with a positive advantage."""

    @staticmethod
    def read_by(method: CreditMethod) -> tuple[str, ...]:
        """The settings (field names) that ``method``'s credit depends on; the others are never read
        on its path, so an experiment that changes only those leaves the method's runs as they were.
        Uniform credit reads none (TRL's advantages stay as they are); every other method runs
        forward passes (``budget``, ``precision``) and keeps views, and a method of the ``share``
        form weights tokens (``mix``; one of the ``advantage`` form gives its token advantages as they
        are); a method whose reward source segments the trace reads ``segmentation``, and each source
        declares the rest (``rredcot.method.registry.register_reward_source``)."""
        if method.uniform:
            return ()
        source = method.reward_source
        names = ["mix", "budget", "precision", "view_every", "view_samples"]
        if method.form == "advantage":
            names.remove("mix")
        if source.segments:
            names.append("segmentation")
        return tuple(dict.fromkeys([*names, *source.reads]))

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check every field (``__post_init__`` does; the trainer does again, for a setting changed
        after construction). A settings section given as a dict (``segmentation={"n_segments": 4}``)
        becomes its class here; anything else that is not that class is refused, naming it."""
        for f in fields(self):
            section = _section_class(f)
            if section is not None:
                setattr(self, f.name, settings_section(section, getattr(self, f.name), f.name))
        for name in ("group_pairs",):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        for name in ("view_every", "view_samples"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        if not isinstance(self.mix, Real) or isinstance(self.mix, bool):
            raise ValueError(f"mix must be a number in [0, 1], got {self.mix!r}")
        choices = {
            "proposal": ("uniform", "given"),
            "value_model": ("policy", "reference"),
            "scorer": ("single_pass", "naive"),
            "precision": ("autocast", "float32"),
            "answer_baseline": ("greedy", "reference"),
            "value_space": VALUE_SPACES,
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
    """A registered credit method (``rredcot.method.registry.CREDIT_METHODS``): ``uniform``,
    ``rredcot``, ``entropy``, ``rredcot+entropy``, ``oracle``, ``exact``, ``mc``, ``spo``, ``prime``."""
    exit_string: str = DEFAULT_EXIT_STRING
    """Text that closes the thinking block at an exit point."""
    answer_prefix: str = DEFAULT_ANSWER_PREFIX
    """Text between a reference solution and its answer."""
    answer_suffix: str = DEFAULT_ANSWER_SUFFIX
    """Text after the reference answer."""

    def validate(self) -> None:
        super().validate()
        for name in ("method", "exit_string", "answer_prefix", "answer_suffix"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{name} must be a string, got {getattr(self, name)!r}")
        method = credit_method(self.method)  # an unknown method fails here, listing the known ones
        if not method.uniform and not self.exit_string.strip():
            # Every method but uniform finds where a completion's thinking ends by it.
            raise ValueError(
                f"exit_string must hold text besides whitespace for credit method {self.method!r}, which "
                f"finds where a completion's thinking ends by it (got {self.exit_string!r}); the default "
                f"is {DEFAULT_EXIT_STRING!r}"
            )
        reads_baseline = "answer_baseline" in self.read_by(method)
        if reads_baseline and self.answer_baseline == "greedy" and not self.answer_prefix.strip():
            raise ValueError("answer_baseline 'greedy' needs a non-blank answer_prefix to end the solution")

    @classmethod
    def from_dict(cls, settings: Mapping[str, Any]) -> CreditConfig:
        """A ``CreditConfig`` from a dict of its settings, nested sections as dicts or as their
        classes (``{"method": "rredcot", "segmentation": {"n_segments": 4}}``); an unknown key is
        refused, naming the known ones."""
        return settings_section(cls, settings, "credit")

    @property
    def kind(self) -> CreditMethod:
        """The registered method."""
        return credit_method(self.method)

    @property
    def rollout_settings(self) -> MonteCarloSettings:
        """The method's policy-rollout settings (what ``PolicyRollouts`` samples with): the first
        section its reward source reads that holds them (``spo`` for SPO-chain, ``mc`` for Monte
        Carlo credit); ``mc`` for a method that reads none."""
        for name in self.kind.reward_source.reads:
            section = getattr(self, name, None)
            if isinstance(section, MonteCarloSettings):
                return section
        return self.mc

    @classmethod
    def from_settings(cls, settings: CreditSettings, **rest: Any) -> CreditConfig:
        """The shared settings plus a method and the exit text."""
        return cls(**{f.name: getattr(settings, f.name) for f in fields(CreditSettings)}, **rest)


def _section_class(f: Any) -> type | None:
    """The settings class of a field that holds a section of settings (its default is an instance
    of a dataclass), else None."""
    factory = f.default_factory
    if factory is not MISSING and isinstance(factory, type) and is_dataclass(factory):
        return factory
    return None


def settings_section(cls: type, value: Any, name: str) -> Any:
    """``value`` as an instance of the settings class ``cls`` (the field ``name``): an instance as it
    is, a dict as ``cls(**value)`` after a check of its keys; anything else is refused, naming ``cls``."""
    if isinstance(value, cls):
        return value
    if not isinstance(value, Mapping):
        raise ValueError(
            f"{name} must be a {cls.__name__} or a dict of its settings, got {type(value).__name__} {value!r}"
        )
    known = [f.name for f in fields(cls) if f.init]
    unknown = sorted(str(k) for k in value if k not in known)
    if unknown:
        raise ValueError(
            f"{name}: {cls.__name__} has no setting(s) {', '.join(unknown)}; "
            f"its settings are {', '.join(known)}"
        )
    return cls(**value)
