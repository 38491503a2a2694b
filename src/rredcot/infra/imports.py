"""Keeping installed packages that a pipeline process never calls from being imported.

Two libraries import an optional package whenever it is installed, used or not: transformers imports
scikit-learn for one generation mode (assisted decoding's candidate generator), which this project does
not use, and TRL's GRPO trainer imports vLLM, which a train job uses only with ``rl.gpu.use_vllm``. Both
decide with ``importlib.util.find_spec``, which answers None for a name that ``sys.modules`` maps to
None (Python's documented way to make an import of it fail). Marking them so before those libraries
load skips the imports, seconds that every workflow job would pay (``python -X importtime -c "import
rredcot.stages.train"``; CHANGELOG.md, 2026-12-03).
"""

from __future__ import annotations

import sys

# Never called by the project's code; scikit-learn comes in as a dependency of mlflow.
UNUSED = ("sklearn",)


def skip_imports(*names: str) -> None:
    """Make ``import NAME`` fail (ModuleNotFoundError) in this process for each name not imported yet,
    so that libraries probing for it take it as absent."""
    for name in names:
        sys.modules.setdefault(name, None)
