"""The synthetic multi-step reasoning task (modular arithmetic chains), in three modules:

- :mod:`.grammar`: how a problem, its solution and a completion are written, and how a problem text
  is read back (:func:`parse_problem`, :func:`solve`);
- :mod:`.truth`: where a completion goes wrong (:func:`culprit`) and the exact value of its prefixes
  (:func:`exact_values`), the knowledge of the ``oracle`` and ``exact`` credit methods;
- :mod:`.generator`: the task's settings (:class:`TaskConfig`), the teacher's traces and the
  deterministic ``sft``, ``rl`` and ``test`` splits (:func:`generate_splits`), label noise in ``rl``.

``rredcot data`` writes the splits of a config (``rredcot.stages.data``).
"""

from __future__ import annotations

from rredcot.data.synthetic.generator import (
    MIDDLE_KEYWORDS,
    NOISE_KINDS,
    SPLITS,
    TaskConfig,
    generate_splits,
    misconceptions,
    noise_counts,
    study_split,
    summarize,
    teacher_step,
    teacher_trace,
)
from rredcot.data.synthetic.grammar import (
    OP_WORDS,
    THINK_END,
    Step,
    apply_op,
    parse_problem,
    problem_text,
    run_chain,
    solution_text,
    solve,
)
from rredcot.data.synthetic.truth import (
    batch_slip_rate,
    chain_value,
    culprit,
    culprit_offset,
    exact_value_functions,
    exact_values,
    step_errors,
)

__all__ = [
    "MIDDLE_KEYWORDS",
    "NOISE_KINDS",
    "OP_WORDS",
    "SPLITS",
    "THINK_END",
    "Step",
    "TaskConfig",
    "apply_op",
    "batch_slip_rate",
    "chain_value",
    "culprit",
    "culprit_offset",
    "exact_value_functions",
    "exact_values",
    "generate_splits",
    "misconceptions",
    "noise_counts",
    "parse_problem",
    "problem_text",
    "run_chain",
    "solution_text",
    "solve",
    "step_errors",
    "study_split",
    "summarize",
    "teacher_step",
    "teacher_trace",
]
