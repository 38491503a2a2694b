"""Every configuration the project ships validates against the schema, layered on the default."""

from __future__ import annotations

from pathlib import Path

import pytest

from rredcot.config import load_config

ROOT = Path(__file__).resolve().parents[1]
OVERLAYS = sorted(
    p for p in (ROOT / "config").rglob("*.yaml") if p.name not in {"config.yaml", "datasets.yaml"}
)


def test_the_overlays_are_found() -> None:
    names = {p.relative_to(ROOT / "config").as_posix() for p in OVERLAYS}
    assert {"smoke.yaml", "localisation.yaml", "paper/table1.yaml", "paper/table2.yaml"} <= names


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.relative_to(ROOT / "config").as_posix())
def test_overlay_validates(overlay: Path) -> None:
    cfg = load_config([str(ROOT / "config" / "config.yaml"), str(overlay)])
    assert cfg["results_dir"].startswith("results")


def test_localisation_recipe_writes_thinking_lines_without_the_starting_value() -> None:
    from rredcot.synthetic import TaskConfig, generate_splits

    cfg = load_config([str(ROOT / "config" / "config.yaml"), str(ROOT / "config" / "localisation.yaml")])
    task = TaskConfig(**{**cfg["data"]["synthetic"], "n_sft": 40, "n_rl": 10, "n_test": 10})
    rows = generate_splits(task)["sft"]
    lines = [line for r in rows for line in r["completion"].split("</think>")[0].splitlines()]
    assert lines and all(line.split(", ", 1)[1][0] in "+-*" for line in lines)
    assert not any(line.startswith("Wait, ") for line in lines)  # mistakes are never corrected
