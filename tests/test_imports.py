"""rredcot.infra.imports: a skipped package is absent to the libraries that probe for it, and the
trainer's imports go through without it (a fresh interpreter each, as a pipeline job starts)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_the_trainer_imports_without_the_skipped_packages() -> None:
    proc = _python(
        "import sys\n"
        "from rredcot.infra.imports import UNUSED, skip_imports\n"
        "skip_imports(*UNUSED, 'vllm')\n"
        "import rredcot.stages.train\n"
        "from transformers.utils import is_sklearn_available\n"
        "from trl.import_utils import is_vllm_available\n"
        "assert not is_sklearn_available() and not is_vllm_available()\n"
        "loaded = [m for m in sys.modules if m.split('.')[0] in ('sklearn', 'vllm') and sys.modules[m]]\n"
        "assert not loaded, loaded\n"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_a_package_imported_already_is_kept() -> None:
    proc = _python(
        "import sys, json\n"
        "from rredcot.infra.imports import skip_imports\n"
        "skip_imports('json', 'rredcot_no_such_package')\n"
        "assert sys.modules['json'] is json\n"
        "try:\n"
        "    import rredcot_no_such_package\n"
        "except ModuleNotFoundError:\n"
        "    pass\n"
        "else:\n"
        "    raise AssertionError('imported')\n"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
