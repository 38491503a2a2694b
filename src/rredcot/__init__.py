"""RREDCoT: segment-level reward redistribution for RL training of reasoning models.

The public API (docs/library.md, "The public API"). A GRPO run with RREDCoT credit is TRL's
``GRPOTrainer`` swapped for :class:`RREDCoTTrainer` and given a :class:`CreditConfig`::

    from rredcot import CreditConfig, RREDCoTTrainer

    trainer = RREDCoTTrainer(model=..., reward_funcs=..., args=GRPOConfig(...), train_dataset=...,
                             credit=CreditConfig(method="rredcot"))

A new credit method is a reward source (:func:`register_reward_source`) and a
:class:`CreditMethod` registered with :func:`register_credit_method`; :func:`credit_method` looks one
up by name and :func:`credit_methods` lists them (docs/library.md, "Adding a credit method").

Every name is imported on first use: ``import rredcot`` itself loads neither torch nor TRL, and no
name here imports the pipeline's packages (Snakemake, MLflow, polars, ...).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# name -> the module that defines it
_EXPORTS = {
    "RREDCoTTrainer": "rredcot.adapter.trainer",
    "CreditConfig": "rredcot.method.settings",
    "CreditSettings": "rredcot.method.settings",
    "MonteCarloSettings": "rredcot.method.settings",
    "SegmentationConfig": "rredcot.method.segmentation",
    "ScoringBudget": "rredcot.method.scoring.types",
    "CreditMethod": "rredcot.method.registry",
    "register_credit_method": "rredcot.method.registry",
    "credit_method": "rredcot.method.registry",
    "register_reward_source": "rredcot.method.registry",
    "SegmentRewards": "rredcot.method.registry",
    "Batch": "rredcot.method.registry",
    "TraceInput": "rredcot.method.registry",
    "credit_multiplier": "rredcot.method.registry",
}

__all__ = [
    "Batch",
    "CreditConfig",
    "CreditMethod",
    "CreditSettings",
    "MonteCarloSettings",
    "RREDCoTTrainer",
    "ScoringBudget",
    "SegmentRewards",
    "SegmentationConfig",
    "TraceInput",
    "__version__",
    "credit_method",
    "credit_methods",
    "credit_multiplier",
    "register_credit_method",
    "register_reward_source",
]

if TYPE_CHECKING:
    from rredcot.adapter.trainer import RREDCoTTrainer
    from rredcot.method.registry import (
        Batch,
        CreditMethod,
        SegmentRewards,
        TraceInput,
        credit_method,
        credit_multiplier,
        register_credit_method,
        register_reward_source,
    )
    from rredcot.method.scoring.types import ScoringBudget
    from rredcot.method.segmentation import SegmentationConfig
    from rredcot.method.settings import CreditConfig, CreditSettings, MonteCarloSettings


def credit_methods() -> tuple[str, ...]:
    """The names of the registered credit methods, in the order they were registered (the built-in
    ones first: ``uniform``, ``entropy``, ``rredcot``, ``rredcot+entropy``, ``oracle``, ``mc``,
    ``exact``, then any a program registered)."""
    registry = importlib.import_module("rredcot.method.registry")
    importlib.import_module("rredcot.method")  # registers the built-in methods
    return tuple(registry.CREDIT_METHODS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rredcot' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next access is a plain lookup
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
