"""The ``rredcot`` command without the pipeline's packages (the library alone, ``pip install
rredcot``): a command that needs them says so in one line instead of an import traceback."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from rredcot import cli

ROOT = Path(__file__).resolve().parents[1]

# Runs every command's --help in one interpreter where the pipeline's modules cannot be imported (a
# finder ahead of every other one refuses them, as a missing package would), and prints each
# command's exit: its SystemExit code or message, or the exception that escaped.
WITHOUT_PIPELINE = """
import contextlib, io, json, sys
from importlib.abc import MetaPathFinder

from rredcot import cli

BLOCKED = set(cli.PIPELINE_MODULES.values())


class NotInstalled(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NotInstalled())
exits = {}
for command in cli.COMMANDS:
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            cli.main([command, "--help"])
        exits[command] = ["returned", ""]
    except SystemExit as exc:
        exits[command] = ["exit", exc.code if isinstance(exc.code, (int, type(None))) else str(exc.code)]
    except BaseException as exc:
        exits[command] = ["raised", f"{type(exc).__name__}: {exc}"]
print(json.dumps(exits))
"""


def _requirement_name(requirement: str) -> str:
    return re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower()


def test_pipeline_modules_are_the_pipeline_extra() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extra = project["optional-dependencies"]["pipeline"]
    assert set(cli.PIPELINE_MODULES) == {_requirement_name(r) for r in extra}


def test_every_command_without_the_pipeline_runs_or_names_the_extra() -> None:
    """Each command's --help, without the pipeline's packages: the command's help (exit 0), or one
    line naming ``rredcot[pipeline]``; never a traceback. The commands that import a pipeline
    package (tracking: mlflow; report: polars; config: pyyaml) are among the second."""
    proc = subprocess.run(
        [sys.executable, "-c", WITHOUT_PIPELINE], capture_output=True, text=True, cwd=ROOT, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    exits = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(exits) == set(cli.COMMANDS)
    hinted = []
    for command, (how, detail) in exits.items():
        assert how == "exit", f"rredcot {command}: {how} {detail}"
        if detail in (0, None):
            continue
        assert isinstance(detail, str) and "\n" not in detail, (command, detail)
        assert detail.startswith(f"rredcot {command}: needs the pipeline's packages ("), detail
        assert detail.endswith(cli.PIPELINE_HINT), detail
        hinted.append(command)
    assert {"tracking", "report", "config"} <= set(hinted), exits


def test_a_missing_pipeline_module_inside_a_command_names_the_extra(monkeypatch) -> None:
    """A pipeline package imported while the command runs (not at its module's import) gets the same
    one line; a missing module that is not the pipeline's keeps its own error."""

    def needs_mlflow(argv: list[str]) -> None:
        import mlflow  # noqa: F401

    monkeypatch.setitem(sys.modules, "mlflow", None)  # import mlflow: ModuleNotFoundError
    monkeypatch.setitem(sys.modules, "rredcot_test_cli", type(sys)("rredcot_test_cli"))
    sys.modules["rredcot_test_cli"].main = needs_mlflow
    monkeypatch.setitem(cli.COMMANDS, "needs-mlflow", cli.Command("rredcot_test_cli:main", "", ""))
    with pytest.raises(SystemExit) as exc:
        cli.main(["needs-mlflow"])
    assert exc.value.code == (
        "rredcot needs-mlflow: needs the pipeline's packages (mlflow is not installed): "
        "pip install 'rredcot[pipeline]'"
    )
    monkeypatch.setitem(cli.COMMANDS, "elsewhere", cli.Command("rredcot_no_such_module:main", "", ""))
    with pytest.raises(ModuleNotFoundError, match="rredcot_no_such_module"):
        cli.main(["elsewhere"])
