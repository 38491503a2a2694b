"""The public API (``from rredcot import ...``, docs/library.md): every name is there, documented,
and importing them pulls in none of the pipeline's packages (each check in a fresh interpreter)."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys

import pytest

import rredcot

PIPELINE = ("snakemake", "mlflow", "polars", "seaborn", "scipy", "matplotlib", "jsonschema", "datasketch")

PUBLIC = (
    "RREDCoTTrainer",
    "CreditConfig",
    "CreditSettings",
    "MonteCarloSettings",
    "SegmentationConfig",
    "ScoringBudget",
    "CreditMethod",
    "register_credit_method",
    "credit_method",
    "credit_methods",
    "register_reward_source",
    "SegmentRewards",
    "Batch",
    "TraceInput",
    "credit_multiplier",
)


def _modules_after(code: str) -> list[str]:
    """The top-level packages loaded after running ``code`` in a fresh interpreter."""
    script = f"{code}\nimport json, sys\nprint(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_all_lists_the_public_names() -> None:
    assert set(rredcot.__all__) == {*PUBLIC, "__version__"}
    assert set(PUBLIC) <= set(dir(rredcot))


@pytest.mark.parametrize("name", PUBLIC)
def test_each_name_has_a_docstring(name: str) -> None:
    obj = getattr(rredcot, name)
    assert (inspect.getdoc(obj) or "").strip(), f"rredcot.{name} has no docstring"


def test_the_names_are_the_library_objects() -> None:
    from rredcot.adapter.trainer import RREDCoTTrainer
    from rredcot.method.registry import CREDIT_METHODS
    from rredcot.method.settings import CreditConfig

    assert rredcot.RREDCoTTrainer is RREDCoTTrainer
    assert rredcot.CreditConfig is CreditConfig
    assert issubclass(rredcot.CreditConfig, rredcot.CreditSettings)
    assert rredcot.credit_methods() == tuple(CREDIT_METHODS)
    assert {"uniform", "rredcot", "entropy", "rredcot+entropy", "oracle", "mc", "exact"} <= set(
        rredcot.credit_methods()
    )
    assert rredcot.credit_method("rredcot").name == "rredcot"
    with pytest.raises(AttributeError):
        rredcot.no_such_name  # noqa: B018


def test_the_registry_takes_a_new_method() -> None:
    method = rredcot.CreditMethod("public_api_check", "none", "entropy", "Entropy weighting, again.")
    rredcot.register_credit_method(method)
    try:
        assert rredcot.credit_method("public_api_check") is method
        assert rredcot.credit_methods()[-1] == "public_api_check"
        with pytest.raises(ValueError, match="registered already"):
            rredcot.register_credit_method(method)
    finally:
        from rredcot.method.registry import CREDIT_METHODS

        del CREDIT_METHODS["public_api_check"]


def test_import_rredcot_loads_neither_torch_nor_trl() -> None:
    loaded = _modules_after("import rredcot")
    assert not {"torch", "trl", "transformers", *PIPELINE} & set(loaded)


# Records, for each pipeline package imported, the module whose code imported it.
_WATCH = """
import sys
PIPELINE = {pipeline!r}
importers = {{}}

class Watch:
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top in PIPELINE and top not in importers:
            frame = sys._getframe(1)
            while frame and frame.f_code.co_filename.startswith("<frozen"):
                frame = frame.f_back
            importers[top] = frame.f_globals.get("__name__", "?") if frame else "?"
        return None

sys.meta_path.insert(0, Watch())
"""


def test_the_public_names_pull_in_no_pipeline_package() -> None:
    """No module of the library imports a pipeline package. Where those packages are installed (this
    environment), TRL and transformers import some of them themselves (mlflow for TRL's profiling,
    scipy through sklearn): only the imports made by rredcot's own modules count. Where they are not
    installed (the wheel without extras, scripts/check-library), such an import would fail."""
    code = _WATCH.format(pipeline=PIPELINE) + f"from rredcot import {', '.join(PUBLIC)}\n"
    code += "import json\nprint(json.dumps(importers))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    importers = json.loads(proc.stdout.strip().splitlines()[-1])
    ours = {pkg: mod for pkg, mod in importers.items() if mod == "rredcot" or mod.startswith("rredcot.")}
    assert not ours, f"the library imports pipeline packages: {ours}"


def test_the_watch_sees_an_import_by_the_library() -> None:
    """The check above can fail: a pipeline module of the package that imports polars is caught."""
    pytest.importorskip("polars")
    code = _WATCH.format(pipeline=PIPELINE) + "import rredcot.infra.results\n"
    code += "import json\nprint(json.dumps(importers))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]).get("polars", "").startswith("rredcot.")
