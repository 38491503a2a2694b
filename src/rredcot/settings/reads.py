"""Which settings each stage reads: the one list behind a rule's ``params``, a job's resume
fingerprint and the config a stage is handed.

A stage's reads come in two kinds:

- ``computes``: settings that shape what the stage writes. They are the rule's ``params``
  (:func:`stage_settings`), so that changing one makes Snakemake run the stage again, and the
  fingerprint under which a killed job's checkpoints are resumed.
- ``runs``: settings the stage reads that do not change its outputs (thread counts, checkpoint
  interval, ports, where MLflow logs). Changing them reruns nothing.

A key names a whole subtree (``"credit"``) or one setting (``"prompt.exit_string"``); a ``runs``
key inside a ``computes`` subtree is taken out of it. ``{arm}`` stands for the job's training method
(its name under ``arms``). A stage whose jobs come in variants (the two trace sets of
``study_traces``) lists what only one variant computes under ``variants``.

The lists are enforced, not just documented: :func:`stage_config` gives a stage the config with
only its declared keys, and reading any other setting raises :class:`UndeclaredSetting`, naming the
key and the stage. A setting a stage reads but does not declare would otherwise leave its results
stale when that setting changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rredcot.method.registry import credit_method
from rredcot.method.settings import CreditSettings
from rredcot.settings.config import ConfigError, load_config

# Where MLflow logs, how long a job waits for it, where the outputs go: every stage reads them, none
# computes with them.
_LOGGING = ("experiment", "results_dir", "tracking")
# How processes are started and talk to each other; a different port computes the same thing.
_PORTS = (
    "distributed.main_process_port",
    "distributed.vllm_server.port",
    "distributed.vllm_server.group_port",
    "distributed.vllm_server.startup_timeout",
)


@dataclass(frozen=True)
class StageReads:
    """The settings one stage reads (dotted keys; see the module docstring)."""

    computes: tuple[str, ...]
    runs: tuple[str, ...] = ()
    variants: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


# The settings of the credit section that the job's training method reads: those its credit method
# depends on (CreditSettings.read_by), so that a change to, say, the Monte Carlo rollouts reruns the
# Monte Carlo method and not the GRPO baseline.
CREDIT_OF_ARM = "credit.<what the arm reads>"

# Traces and Monte Carlo rollouts are sampled alike.
_STUDY_SAMPLING = ("studies.seed", "studies.temperature", "studies.top_p")
# The texts around an exit point, which the attribution passes put after a trace's thinking.
_EXIT_TEXTS = ("prompt.exit_string", "prompt.answer_prefix", "prompt.answer_suffix")
# How the local PRM is trained (studies.prm, kind local).
_PRM_TRAINING = tuple(
    f"studies.prm.{key}"
    for key in "epochs batch_size learning_rate weight_decay val_fraction label answer_hint".split()
)

READS: dict[str, StageReads] = {
    "data": StageReads(("data.kind", "data.synthetic"), _LOGGING),
    "study_problems": StageReads(("data.kind", "data.synthetic", "studies.prm.analysis_problems"), _LOGGING),
    "fetch": StageReads(
        ("data.kind", "data.registry", "data.root", "data.train", "data.heldout", "data.benchmarks")
        + ("data.max_rows",),
        _LOGGING,
    ),
    "clean": StageReads(("clean",), _LOGGING),
    "model": StageReads(("model.kind", "model.gguf"), _LOGGING),
    "sft": StageReads(
        ("model", "sft", "prompt.template", "prompt.style", "prompt.system_prompt", "prompt.think_start")
        + ("distributed",),
        (*_LOGGING, *_PORTS, "threads.sft", "sft.save_every", "sft.resume", "sft.enabled"),
    ),
    "train": StageReads(
        ("arms.{arm}", "rl", CREDIT_OF_ARM, "prompt", "eval", "model", "distributed"),
        (*_LOGGING, *_PORTS, "threads.train", "rl.save_every", "rl.resume", "vllm_cpu"),
    ),
    "evaluate": StageReads(("eval", "prompt", "model.dtype"), (*_LOGGING, "threads.eval", "vllm_cpu")),
    "report": StageReads(
        ("arms", "run_arms", "report.pairs", "eval.n_samples", "eval.temperature", "rl.eval_problems")
        + ("studies.bootstrap", "studies.seed"),
        _LOGGING,
    ),
    "tables": StageReads(
        ("arms", "run_arms", "report", "eval.n_samples", "rl.prompts_per_step", "rl.num_generations"),
        _LOGGING,
    ),
    "claims": StageReads(
        (
            "arms",
            "run_arms",
            "rl.max_steps",
            "credit.mc.samples",
            "studies.n_traces",
            "studies.prm.analysis_problems",
        ),
        _LOGGING,
    ),
    # The analyses, each handed its settings by these lists alone (their rules pass only files):
    # traces of held-out problems (analysis, localisation) or of the RL split (prm, only to train
    # the small process reward model); a set's size is its variant's setting.
    "study_traces": StageReads(
        ("arms", "credit", "prompt", "model.dtype", "studies.max_new_tokens", *_STUDY_SAMPLING),
        (*_LOGGING, "threads.eval"),
        variants={
            "analysis": ("studies.n_traces",),
            "prm": ("studies.prm.n_traces",),
            "localisation": ("studies.localisation_traces",),
            "prm_analysis": ("studies.prm.analysis_problems",),
        },
    ),
    "study_mc": StageReads(
        ("prompt.exit_string", "model.dtype", "studies.mc_samples", "studies.mc_max_new_tokens")
        + (*_STUDY_SAMPLING, "studies.backend", "eval.vllm"),
        (*_LOGGING, "threads.eval", "vllm_cpu"),
    ),
    "study_mc_figures": StageReads(("studies.bootstrap", "studies.seed"), _LOGGING),
    "study_attribution": StageReads(
        (*_EXIT_TEXTS, "model.dtype", "credit.budget.max_batch_tokens"), (*_LOGGING, "threads.eval")
    ),
    "study_prm_train": StageReads((*_PRM_TRAINING, "studies.seed"), (*_LOGGING, "threads.train")),
    "study_prm": StageReads(
        ("prompt.template", "prompt.style", "model.dtype", "studies.prm.kind", "studies.prm.name_or_path"),
        (*_LOGGING, "threads.eval"),
    ),
    "study_attr_figures": StageReads((), _LOGGING),
    # Every credit method on the analysis traces: each reads the credit settings (and its arm's
    # options), Monte Carlo's rollouts are sampled as the traces were.
    "study_fidelity": StageReads(
        ("arms", "credit", "prompt", "model.dtype", "studies.max_new_tokens", "studies.fidelity")
        # PRIME's groups, the batches of its PRM, and the policy's pace, which its PRM's follows.
        + ("rl.num_generations", "rl.prompts_per_step", "rl.learning_rate")
        + (*_STUDY_SAMPLING, "studies.backend", "eval.vllm"),
        (*_LOGGING, "threads.eval", "vllm_cpu"),
    ),
    "study_localisation": StageReads((), _LOGGING),
}


class UndeclaredSetting(LookupError):
    """A stage read a setting that :data:`READS` does not list for it."""


def _split(key: str) -> tuple[str, ...]:
    return tuple(key.split("."))


def _keys(
    stage: str,
    which: str,
    arm: str | None,
    variant: str | None = None,
    cfg: Mapping[str, Any] | None = None,
) -> list[tuple[str, ...]]:
    """The dotted keys of one kind; ``variant`` None = every variant's (what the stage may read).
    ``cfg`` resolves :data:`CREDIT_OF_ARM` (the arm's credit method)."""
    try:
        reads = READS[stage]
    except KeyError:
        raise KeyError(f"unknown stage {stage!r}; stages: {', '.join(READS)}") from None
    names = list(getattr(reads, which))
    if which == "computes":
        if variant is not None and variant not in reads.variants:
            raise KeyError(f"stage {stage!r} has no variant {variant!r}")
        names += [k for v, keys in reads.variants.items() if variant in (None, v) for k in keys]
    keys = []
    for key in names:
        if key == CREDIT_OF_ARM:
            if arm is not None and cfg is not None:
                method = credit_method(cfg["arms"][arm]["credit"])
                keys += [("credit", name) for name in CreditSettings.read_by(method)]
            continue
        if "{arm}" in key:
            if arm is None:
                continue
            key = key.format(arm=arm)
        keys.append(_split(key))
    return keys


def _subtree(cfg: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = cfg
    for part in path:
        node = node[part]
    return node


def _without(value: Any, path: tuple[str, ...]) -> Any:
    """``value`` (a plain copy) with the setting at ``path`` (relative to it) removed."""
    if not path or not isinstance(value, Mapping) or path[0] not in value:
        return value
    if len(path) == 1:
        return {k: v for k, v in value.items() if k != path[0]}
    return {**value, path[0]: _without(value[path[0]], path[1:])}


def stage_settings(
    cfg: Mapping[str, Any], stage: str, arm: str | None = None, variant: str | None = None
) -> dict[str, Any]:
    """The values of the settings that shape the outputs of one ``stage`` job (of ``arm``, of
    ``variant``), by dotted key: the rule's ``params`` and the resume fingerprint. ``cfg`` is the
    validated config or the stage's view of it."""
    if variant is None and READS[stage].variants:
        raise KeyError(f"stage {stage!r} needs a variant: {', '.join(READS[stage].variants)}")
    runs = _keys(stage, "runs", arm)
    out = {}
    for path in _keys(stage, "computes", arm, variant, cfg):
        value = _plain(_subtree(cfg, path))
        for other in runs:
            if other[: len(path)] == path and len(other) > len(path):
                value = _without(value, other[len(path) :])
        out[".".join(path)] = value
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


class StageView(dict):
    """A config section as one stage sees it: a plain dict holding only the settings the stage
    declares; looking up any other setting raises :class:`UndeclaredSetting`."""

    def __init__(self, data: Mapping[str, Any], stage: str, where: str) -> None:
        super().__init__(data)
        self.stage, self.where = stage, where

    def _undeclared(self, key: object) -> UndeclaredSetting:
        name = f"{self.where}.{key}" if self.where else str(key)
        return UndeclaredSetting(
            f"stage {self.stage!r} read the setting {name!r}, which rredcot.settings.reads.READS does not "
            f"list for it: declare it there (computes, or runs if it cannot change the outputs)"
        )

    def __missing__(self, key: object) -> Any:
        raise self._undeclared(key)

    def get(self, key: object, default: Any = None) -> Any:
        if key in self:
            return self[key]
        raise self._undeclared(key)

    def __reduce__(self) -> tuple:
        return (StageView, (dict(self), self.stage, self.where))


def _view(cfg: Mapping[str, Any], paths: list[tuple[str, ...]], stage: str, where: tuple[str, ...]) -> Any:
    if any(len(p) == len(where) for p in paths):  # a whole subtree is declared
        return _plain(cfg)
    children: dict[str, list[tuple[str, ...]]] = {}
    for p in paths:
        children.setdefault(p[len(where)], []).append(p)
    data = {key: _view(cfg[key], sub, stage, (*where, key)) for key, sub in children.items() if key in cfg}
    return StageView(data, stage, ".".join(where))


def stage_view(cfg: Mapping[str, Any], stage: str, arm: str | None = None) -> StageView:
    """The validated config ``cfg`` restricted to what ``stage`` declares (computes and runs)."""
    if arm is not None and arm not in cfg["arms"]:
        raise ConfigError(f"unknown arm {arm!r}; configured arms: {', '.join(cfg['arms'])}")
    paths = _keys(stage, "computes", arm, cfg=cfg) + _keys(stage, "runs", arm)
    for path in paths:
        try:
            _subtree(cfg, path)
        except (KeyError, TypeError):
            raise KeyError(f"READS[{stage!r}] names {'.'.join(path)!r}, which is not a setting") from None
    return _view(cfg, paths, stage, ())


def stage_config(
    paths: str | Path | Iterable[str | Path],
    stage: str,
    arm: str | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> StageView:
    """Load and validate the config files, and give ``stage`` its view of them."""
    return stage_view(load_config(paths, overrides), stage, arm)
