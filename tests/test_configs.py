"""Every configuration the project ships validates against the schema, layered on the default."""

from __future__ import annotations

from pathlib import Path

import pytest

from rredcot.settings.config import load_config
from rredcot.stages import config as config_stage

ROOT = Path(__file__).resolve().parents[1]
OVERLAYS = sorted(
    p
    for p in (ROOT / "config").rglob("*.yaml")
    if p.name not in {"config.yaml", "datasets.yaml"} and p.parent.name != "accelerate"
)
ACCELERATE = sorted((ROOT / "config" / "accelerate").glob("*.yaml"))


def test_the_overlays_are_found() -> None:
    names = {p.relative_to(ROOT / "config").as_posix() for p in OVERLAYS}
    assert {"smoke.yaml", "restating.yaml", "paper/table1.yaml", "paper/table2.yaml"} <= names


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.relative_to(ROOT / "config").as_posix())
def test_overlay_validates(overlay: Path) -> None:
    cfg = load_config([str(ROOT / "config" / "config.yaml"), str(overlay)])
    assert cfg["results_dir"].startswith("results")


def _thinking_lines(*overlays: str) -> list[str]:
    from rredcot.data.synthetic import TaskConfig, generate_splits

    cfg = load_config([str(ROOT / "config" / "config.yaml"), *(str(ROOT / "config" / o) for o in overlays)])
    task = TaskConfig(**{**cfg["data"]["synthetic"], "n_sft": 40, "n_rl": 10, "n_test": 10})
    rows = generate_splits(task)["sft"]
    # Rows that start at an exit point hold their thinking in "given" and only the solution as
    # completion.
    traces = [r.get("given", "") + r["completion"] for r in rows]
    return [line for trace in traces for line in trace.split("</think>")[0].splitlines()]


def test_the_default_writes_thinking_lines_without_the_starting_value() -> None:
    lines = _thinking_lines()
    assert lines and all(line.split(", ", 1)[1][0] in "+-*" for line in lines)
    assert not any(line.startswith("Wait, ") for line in lines)  # mistakes are never corrected


def test_the_restating_recipe_restates_and_corrects() -> None:
    lines = _thinking_lines("restating.yaml")
    assert all(line.split(", ", 1)[1][0].isdigit() for line in lines)
    assert any(line.startswith("Wait, ") for line in lines)


@pytest.mark.parametrize("path", ACCELERATE, ids=lambda p: p.name)
def test_accelerate_configs_load(path: Path) -> None:
    """Each shipped accelerate config is what its name says, in accelerate's own format."""
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(path))
    kind = {
        "ddp.yaml": "MULTI_GPU",
        "zero2.yaml": "DEEPSPEED",
        "zero3.yaml": "DEEPSPEED",
        "fsdp.yaml": "FSDP",
    }
    assert str(config.distributed_type).split(".")[-1] == kind[path.name]
    if path.name.startswith("zero"):
        assert config.deepspeed_config["zero_stage"] == int(path.name[4])
    if path.name == "fsdp.yaml":
        assert (
            int(config.fsdp_config["fsdp_version"]) == 2
        )  # FSDP1 cannot give the credit passes whole weights


def test_recipes_name_shipped_accelerate_configs_and_split_their_batch() -> None:
    from rredcot.adapter.experiment import micro_batching

    for name in ("table1", "table2"):
        cfg = load_config(
            [str(ROOT / "config" / "config.yaml"), str(ROOT / "config" / "paper" / f"{name}.yaml")]
        )
        dist = cfg["distributed"]
        assert (ROOT / dist["accelerate_config"]).is_file()
        micro, accumulate = micro_batching(cfg, dist["gpus_per_node"] * dist["nodes"])
        rl = cfg["rl"]
        assert micro * accumulate * dist["gpus_per_node"] == rl["prompts_per_step"] * rl["num_generations"]
        assert not cfg["rl"]["probe"]["greedy"]  # thinking models are probed by sampling


def test_derived_config_files_are_current() -> None:
    """config/config.yaml, config/README.md and the JSON schema are generated from the settings
    tree: `rredcot config --write` after changing a default or its documentation."""
    with pytest.raises(SystemExit) as exc:
        config_stage.main(["--check"])
    assert exc.value.code == 0


def test_config_check_catches_a_stale_file(tmp_path, monkeypatch) -> None:
    stale = tmp_path / "README.md"
    stale.write_text("# hand-edited\n")
    monkeypatch.setattr(config_stage, "CONFIG_README", stale)
    monkeypatch.setattr(config_stage, "ROOT", tmp_path)
    with pytest.raises(SystemExit) as exc:
        config_stage.main(["--check"])
    assert exc.value.code == 1


def test_the_embedded_default_is_the_settings_tree() -> None:
    from rredcot.settings.config import defaults, load_config

    assert load_config(ROOT / "config" / "config.yaml") == defaults()


def test_arm_credit_choices_are_the_registered_methods() -> None:
    from rredcot.method.credit import CREDIT_METHODS
    from rredcot.settings.config import schema

    arm = schema()["properties"]["arms"]["additionalProperties"]["properties"]
    assert arm["credit"]["enum"] == list(CREDIT_METHODS)


def test_a_yaml_float_read_as_text_gets_a_hint(tmp_path) -> None:
    from rredcot.settings.config import ConfigError

    overlay = tmp_path / "lr.yaml"
    overlay.write_text("rl:\n  learning_rate: 3e-4\n")  # YAML 1.1: a string, not a float
    with pytest.raises(ConfigError, match=r"rl.learning_rate: expected a number, got '3e-4' \(YAML reads"):
        load_config([str(ROOT / "config" / "config.yaml"), str(overlay)])
    overlay.write_text("rl:\n  learning_rate: 3.0e-4\n")
    assert load_config([str(ROOT / "config" / "config.yaml"), str(overlay)])["rl"]["learning_rate"] == 3e-4
