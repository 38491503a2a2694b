"""Every configuration the project ships validates against the schema, layered on the default."""

from __future__ import annotations

from pathlib import Path

import pytest

from rredcot.settings.config import load_config
from rredcot.tools import config as config_stage

ROOT = Path(__file__).resolve().parents[1]
OVERLAYS = sorted(
    p
    for p in (ROOT / "config").rglob("*.yaml")
    if p.name not in {"config.yaml", "datasets.yaml"} and p.parent.name != "accelerate"
)
ACCELERATE = sorted((ROOT / "config" / "accelerate").glob("*.yaml"))
# Overlays that run on top of another (their header's command names both), by file name.
LAYERED_ON = {"smollm2-math.yaml": ["smollm2.yaml"], "cpu-float32.yaml": ["smollm2.yaml"]}


def _stack(overlay: Path) -> list[str]:
    """The files a shipped overlay runs with: the default, what it layers on, itself."""
    under = [str(ROOT / "config" / name) for name in LAYERED_ON.get(overlay.name, [])]
    return [str(ROOT / "config" / "config.yaml"), *under, str(overlay)]


def test_the_overlays_are_found() -> None:
    names = {p.relative_to(ROOT / "config").as_posix() for p in OVERLAYS}
    assert {"smoke.yaml", "restating.yaml", "paper/table1.yaml", "paper/table2.yaml"} <= names


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.relative_to(ROOT / "config").as_posix())
def test_overlay_validates(overlay: Path) -> None:
    cfg = load_config(_stack(overlay))
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
    from rredcot.method.registry import CREDIT_METHODS
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


_DATASETS = {
    "data": {"kind": "datasets", "train": "t", "heldout": "h", "benchmarks": {"b": "b"}},
    "sft": {"enabled": False},
    "model": {"kind": "pretrained", "name_or_path": "m"},
}
# Settings with which the method cannot work, and the key each rejection names.
_REJECTED = {
    "empty exit string": ({"prompt": {"exit_string": ""}}, r"prompt\.exit_string: must not be empty"),
    "blank exit string": ({"prompt": {"exit_string": " \n"}}, r"prompt\.exit_string: must not be empty"),
    "blank answer prefix, greedy baseline": (
        {"prompt": {"answer_prefix": " "}},
        r"arms\.rredcot: answer_baseline 'greedy' needs a non-blank answer_prefix .*"
        r"prompt\.answer_prefix is ' ', credit\.answer_baseline 'greedy'",
    ),
    "blank answer prefix, an arm's greedy baseline": (
        {
            "prompt": {"answer_prefix": ""},
            "credit": {"answer_baseline": "reference"},
            "arms": {"rredcot_entropy": {"credit_options": {"answer_baseline": "greedy"}}},
        },
        r"arms\.rredcot_entropy: .*arms\.rredcot_entropy\.credit_options\.answer_baseline 'greedy'",
    ),
    "chat prompt, scratch tokenizer": ({"prompt": {"style": "chat"}}, r"prompt\.style: chat needs model"),
    "no run arms": ({"run_arms": []}, r"run_arms: must hold at least 1 item"),
    "a run arm twice": ({"run_arms": ["grpo", "grpo"]}, r"run_arms: must not hold an item twice"),
    "oracle on real datasets": (
        {**_DATASETS, "run_arms": ["grpo", "oracle"]},
        r"run_arms: arm oracle \(credit oracle\) needs data\.kind synthetic",
    ),
    "fresh PRM problems on real datasets": (
        {**_DATASETS, "run_arms": ["grpo"], "studies": {"prm": {"analysis_problems": 100}}},
        r"studies\.prm\.analysis_problems: fresh problems of their own need data\.kind synthetic",
    ),
    "no seeds": ({"seeds": []}, r"seeds: must hold at least 1 item"),
    "a seed twice": ({"seeds": [1, 1]}, r"seeds: must not hold an item twice"),
    "no experiment name": ({"experiment": ""}, r"experiment: must not be empty"),
    "blank results dir": ({"results_dir": " "}, r"results_dir: must not be empty"),
    "unknown table2 arm": ({"report": {"table2_arms": ["grpo", "no"]}}, r"report\.table2_arms: unknown arm"),
    "error rate above 1": (
        {"data": {"synthetic": {"teacher_error_rate": 1.5}}},
        r"data\.synthetic: teacher_error_rate must be in \[0, 1\]",
    ),
    "negative fix rate": (
        {"data": {"synthetic": {"teacher_fix_rate": -0.1}}},
        r"data\.synthetic: teacher_fix_rate must be in \[0, 1\]",
    ),
    "early-exit rate above 1": (
        {"data": {"synthetic": {"teacher_early_exit_rate": 2.0}}},
        r"data\.synthetic: teacher_early_exit_rate must be in \[0, 1\]",
    ),
    "negative noise weight": (
        {"data": {"synthetic": {"noise_kinds": {"wrong_answer": -1.0}}}},
        r"data\.synthetic: noise_kinds: weights must not be negative",
    ),
    "negative split": ({"data": {"synthetic": {"n_sft": -1}}}, r"data\.synthetic: n_sft must not be negat"),
    "no RL rows": ({"data": {"synthetic": {"n_rl": 0}}}, r"data\.synthetic\.n_rl: RL needs at least 1 row"),
    "no test rows": ({"data": {"synthetic": {"n_test": 0}}}, r"data\.synthetic\.n_test: evaluation needs"),
    "no SFT rows": ({"data": {"synthetic": {"n_sft": 0}}}, r"data\.synthetic\.n_sft: SFT needs at least 1"),
    "no rows kept": (
        {"data": {"max_rows": {"train": 0}}},
        r"data\.max_rows\.train: must be at least 1, got 0$",
    ),
    "rows of an unknown dataset": (
        {"data": {"max_rows": {"tran": 10}}},
        r"data: max_rows\.tran: no such dataset",
    ),
    "zero shingle size": ({"clean": {"shingle_size": 0}}, r"clean\.shingle_size: must be at least 1"),
    "zero permutations": ({"clean": {"minhash_permutations": 0}}, r"clean\.minhash_permutations: must be at"),
    "zero near-duplicate threshold": (
        {"clean": {"near_duplicate_threshold": 0.0}},
        r"clean\.near_duplicate_threshold: must be greater than 0",
    ),
    "near-duplicate threshold above 1": (
        {"clean": {"near_duplicate_threshold": 1.5}},
        r"clean\.near_duplicate_threshold: must be at most 1",
    ),
    "no resolve samples": ({"clean": {"resolve_samples": 0}}, r"clean\.resolve_samples: must be at least 1"),
    "a negative seed": ({"seeds": [0, -1]}, r"seeds\[1\]: must be at least 0, got -1"),
    "a Monte Carlo budget of no rollouts": (
        {"studies": {"fidelity": {"mc_samples": [0, 2]}}},
        r"studies\.fidelity\.mc_samples\[0\]: must be at least 1, got 0",
    ),
    "one table2 arm": (
        {"report": {"table2_arms": ["grpo"]}},
        r"report\.table2_arms: must hold at least 2 item",
    ),
    "three table2 arms": (
        {"report": {"table2_arms": ["grpo", "rredcot", "mc"]}},
        r"report\.table2_arms: must hold at most 2 item",
    ),
}

# Values of the wrong type, and the key and words each rejection gives.
_MISTYPED = {
    "text for an integer": ({"rl": {"max_steps": "ten"}}, "rl.max_steps: expected an integer, got 'ten'"),
    "a float for an integer": ({"rl": {"max_steps": 10.0}}, "rl.max_steps: expected an integer, got 10.0"),
    "true for an integer": ({"rl": {"max_steps": True}}, "rl.max_steps: expected an integer, got True"),
    "an integer for a flag": ({"sft": {"enabled": 1}}, "sft.enabled: expected true or false, got 1"),
    "a list item": ({"seeds": [1, "two"]}, "seeds[1]: expected an integer, got 'two'"),
    "an item of a list or null": ({"run_arms": ["grpo", 3]}, "run_arms[1]: expected a string, got 3"),
    "a choice": (
        {"prompt": {"style": "fancy"}},
        "prompt.style: expected one of 'template', 'chat', got 'fancy'",
    ),
    "a section": ({"rl": 3}, "rl: expected a mapping, got 3"),
    "a key of a mapping": ({"arms": {1: {"credit": "uniform"}}}, "arms: expected a string, got 1"),
    "a value of a mapping": (
        {"data": {"max_rows": {"train": "x"}}},
        "data.max_rows.train: expected an integer",
    ),
    "an unknown key": ({"rl": {"zz": 1, "aa": 2}}, "rl.aa: unknown key (known: max_steps, "),
    "a required key": ({"arms": {"new": {"label": "x"}}}, "arms.new.credit: required"),
    "an arm's credit option": (
        {"arms": {"rredcot": {"credit_options": {"mix": "x"}}}},
        "\n  arms.rredcot.credit_options.mix: expected a number, got 'x'",
    ),
}


@pytest.mark.parametrize("override, message", _MISTYPED.values(), ids=_MISTYPED.keys())
def test_a_value_of_the_wrong_type_is_rejected_by_name(override, message) -> None:
    from rredcot.settings.config import ConfigError, validate

    with pytest.raises(ConfigError) as exc:
        validate(override)
    assert message in str(exc.value)


def test_an_empty_section_takes_its_defaults() -> None:
    from rredcot.settings.config import defaults, validate

    # `rl:` with nothing under it is YAML's null.
    assert validate({"rl": None}) == defaults()


def test_the_schema_file_takes_every_shipped_config() -> None:
    """The committed schema itself, read by jsonschema alone, takes every shipped config and refuses
    a bad value: the file is the schema configs are validated against, not a by-product."""
    import jsonschema
    import yaml

    from rredcot.settings.config import deep_merge

    schema = yaml.safe_load((ROOT / "src" / "rredcot" / "schemas" / "config.schema.yaml").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    validator.check_schema(schema)
    for overlay in [ROOT / "config" / "config.yaml", *OVERLAYS]:
        validator.validate(load_config(_stack(overlay)))
    bad = deep_merge(load_config(ROOT / "config" / "config.yaml"), {"rl": {"max_steps": "ten"}})
    assert [list(e.absolute_path) for e in validator.iter_errors(bad)] == [["rl", "max_steps"]]


@pytest.mark.parametrize("override, message", _REJECTED.values(), ids=_REJECTED.keys())
def test_a_setting_the_method_cannot_work_with_is_rejected_by_name(override, message) -> None:
    from rredcot.settings.config import ConfigError, validate

    with pytest.raises(ConfigError, match=message):
        validate(override)


def test_what_the_rules_leave_alone_still_loads() -> None:
    from rredcot.settings.config import credit_config, validate

    # A blank answer prefix with the reference answer baseline: nothing decodes a solution, and the
    # jobs of every arm build their credit (a uniform arm never reads the answer baseline).
    cfg = validate({"prompt": {"answer_prefix": ""}, "credit": {"answer_baseline": "reference"}})
    assert [credit_config(cfg, arm).method for arm in ("grpo", "rredcot")] == ["uniform", "rredcot"]
    # Real datasets without the oracle arm; a synthetic task without SFT rows when SFT is off.
    validate({**_DATASETS, "run_arms": ["grpo", "rredcot", "mc"]})
    sft_off = {"sft": {"enabled": False}, "model": {"kind": "pretrained", "name_or_path": "m"}}
    validate({**sft_off, "data": {"synthetic": {"n_sft": 0}, "max_rows": {"heldout": 5}}})


def test_the_schema_carries_the_new_constraints() -> None:
    from rredcot.settings.config import schema

    props = schema()["properties"]
    assert props["prompt"]["properties"]["exit_string"]["pattern"] == r"\S"
    assert props["run_arms"]["minItems"] == 1 and props["run_arms"]["uniqueItems"] is True
    assert props["clean"]["properties"]["shingle_size"]["minimum"] == 1
