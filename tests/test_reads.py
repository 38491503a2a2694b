"""The settings each stage reads (rredcot.settings.reads): one list for rule params, resume
fingerprints and the config view a stage is held to. The workflow side (a changed setting reruns
exactly its readers under ``snakemake -n``) is in test_workflow.py."""

from __future__ import annotations

import ast
import json
import pickle
import re
from pathlib import Path

import pytest

from rredcot.method.registry import credit_method
from rredcot.method.settings import CreditSettings
from rredcot.settings.config import ConfigError, credit_config, validate
from rredcot.settings.reads import CREDIT_OF_ARM, READS, UndeclaredSetting, stage_settings, stage_view
from rredcot.stages import sft as sft_stage
from rredcot.stages import train as train_stage

ROOT = Path(__file__).resolve().parents[1]
CFG = validate({})


def _leaves(tree: dict, prefix: str = "") -> list[str]:
    out = []
    for key, value in tree.items():
        name = f"{prefix}{key}"
        out += _leaves(value, name + ".") if isinstance(value, dict) and value else [name]
    return out


def _set(tree: dict, key: str, value) -> dict:
    out = json.loads(json.dumps(tree))
    node = out
    *parents, leaf = key.split(".")
    for part in parents:
        node = node[part]
    node[leaf] = value
    return out


@pytest.mark.parametrize("stage", sorted(READS))
def test_every_declared_key_is_a_setting(stage: str) -> None:
    view = stage_view(CFG, stage, "rredcot")
    json.dumps(view)  # plain data: loggable, picklable
    assert pickle.loads(pickle.dumps(view)) == view


def _declared(keys: tuple[str, ...], arm: str) -> list[str]:
    out = []
    for key in keys:
        if key == CREDIT_OF_ARM:
            method = credit_method(CFG["arms"][arm]["credit"])
            out += [f"credit.{name}" for name in CreditSettings.read_by(method)]
        else:
            out.append(key.format(arm=arm))
    return out


@pytest.mark.parametrize(
    ("stage", "arm"),
    [(stage, "rredcot") for stage in sorted(READS)]
    + [("train", a) for a in ("grpo", "mc", "oracle", "entropy")],
)
def test_settings_change_exactly_with_their_computes_keys(stage: str, arm: str) -> None:
    """Every leaf of the config, changed on its own: the stage's settings change iff the leaf lies
    under a computes key and not under a runs key."""
    reads = READS[stage]
    variant = next(iter(reads.variants), None)
    keys = _declared((*reads.computes, *reads.variants.get(variant, ())), arm)
    runs = _declared(reads.runs, arm)
    before = stage_settings(CFG, stage, arm, variant)
    for leaf in _leaves(CFG):
        if leaf == f"arms.{arm}.credit" and CREDIT_OF_ARM in reads.computes:
            continue  # not a method name: test_train_reads_the_credit_settings_its_method_reads
        after = stage_settings(_set(CFG, leaf, "<changed>"), stage, arm, variant)
        under = any(leaf == k or leaf.startswith(k + ".") for k in keys)
        skipped = any(leaf == k or leaf.startswith(k + ".") for k in runs)
        assert (after != before) == (under and not skipped), f"{stage} ({arm}): {leaf}"


def test_train_reads_the_credit_settings_its_method_reads() -> None:
    """A change to the Monte Carlo rollouts reruns the MC arm only; one to the exit-point scoring
    the RREDCoT arms only; uniform credit (the GRPO baselines) reads no credit setting at all."""
    credit = {
        arm: {k for k in stage_settings(CFG, "train", arm) if k.startswith("credit.")} for arm in CFG["arms"]
    }
    assert credit["grpo"] == credit["dapo"] == credit["entropy_mask"] == set()
    assert "credit.mc" in credit["mc"] and "credit.mc" not in credit["rredcot"] | credit["oracle"]
    assert {"credit.scorer", "credit.answer_baseline"} <= credit["rredcot"] & credit["rredcot_entropy"]
    assert not {"credit.scorer", "credit.answer_baseline"} & (credit["mc"] | credit["oracle"])
    assert "credit.segmentation" in credit["oracle"] and "credit.segmentation" not in credit["entropy"]
    changed = _set(CFG, "credit.mc.samples", 8)
    rerun = {
        arm
        for arm in CFG["arms"]
        if stage_settings(changed, "train", arm) != stage_settings(CFG, "train", arm)
    }
    assert rerun == {"mc"}
    # The method itself is the arm's own setting: another one reads other settings.
    other = _set(CFG, "arms.grpo.credit", "mc")
    assert stage_settings(other, "train", "grpo")["credit.mc"] == CFG["credit"]["mc"]
    # A uniform arm's job sees no credit section, and its credit config still builds.
    view = stage_view(CFG, "train", "grpo")
    assert "credit" not in view and credit_config(view, "grpo").kind.uniform


def test_the_view_refuses_undeclared_settings() -> None:
    view = stage_view(CFG, "evaluate")
    assert view["eval"]["n_samples"] == CFG["eval"]["n_samples"]
    assert view["model"]["dtype"] == CFG["model"]["dtype"]
    with pytest.raises(UndeclaredSetting, match="'model.hidden_size'"):
        view["model"]["hidden_size"]
    with pytest.raises(UndeclaredSetting, match="'rl'"):
        view.get("rl")
    with pytest.raises(UndeclaredSetting, match="stage 'evaluate'"):
        view["credit"]


def test_a_job_sees_only_its_own_arm() -> None:
    view = stage_view(CFG, "train", "entropy")
    assert list(view["arms"]) == ["entropy"]
    assert "arms.entropy" in stage_settings(view, "train", "entropy")
    with pytest.raises(ConfigError, match="unknown arm 'nope'"):
        stage_view(CFG, "train", "nope")


def test_checkpoint_settings_are_not_computed_with() -> None:
    for stage, section in (("train", "rl"), ("sft", "sft")):
        settings = stage_settings(CFG, stage, "grpo")[section]
        assert "save_every" not in settings and "resume" not in settings
        assert "learning_rate" in settings


def test_variants_differ_only_in_their_own_keys() -> None:
    analysis = stage_settings(CFG, "study_traces", variant="analysis")
    prm = stage_settings(CFG, "study_traces", variant="prm")
    localisation = stage_settings(CFG, "study_traces", variant="localisation")
    assert set(analysis) ^ set(prm) == {"studies.n_traces", "studies.prm.n_traces"}
    assert set(analysis) ^ set(localisation) == {"studies.n_traces", "studies.localisation_traces"}
    with pytest.raises(KeyError, match="needs a variant"):
        stage_settings(CFG, "study_traces")


def test_resume_fingerprints_use_the_same_settings() -> None:
    view = stage_view(CFG, "train", "rredcot")
    assert train_stage.job_settings(view, "rredcot", 3) == {
        "settings": stage_settings(CFG, "train", "rredcot"),
        "seed": 3,
    }
    assert sft_stage.job_settings(stage_view(CFG, "sft")) == stage_settings(CFG, "sft")


def _rule_blocks() -> dict[str, str]:
    """Rule name -> its text, from every rules file: the lines after ``rule NAME:`` that are
    indented deeper than it (rules inside an ``if`` block included)."""
    blocks: dict[str, str] = {}
    for path in sorted((ROOT / "workflow" / "rules").glob("*.smk")):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            found = re.match(r"(\s*)rule (\w+):\s*$", line)
            if not found:
                continue
            indent, body = len(found.group(1)), []
            for nxt in lines[i + 1 :]:
                if nxt.strip() and len(nxt) - len(nxt.lstrip()) <= indent:
                    break
                body.append(nxt)
            assert found.group(2) not in blocks, f"rule {found.group(2)} twice"
            blocks[found.group(2)] = "\n".join(body)
    return blocks


def _stage_module(block: str) -> str:
    """The module whose ``main`` the rule's command runs (``rredcot launch STAGE`` runs STAGE's)."""
    from rredcot.cli import STAGES

    words = re.search(r'"(?:exec )?rredcot (\S+)(?: (\S+))?', block)
    assert words, block
    command = words.group(2) if words.group(1) == "launch" else words.group(1)
    return STAGES[command].split(":")[0]


def _opened_views(module: str) -> set[str]:
    """The stages whose view ``module`` opens: literal stage names of its ``stage_config`` calls."""
    tree = ast.parse((ROOT / "src" / Path(*module.split("."))).with_suffix(".py").read_text())
    return {
        call.args[1].value
        for call in ast.walk(tree)
        if isinstance(call, ast.Call)
        and getattr(call.func, "id", getattr(call.func, "attr", None)) == "stage_config"
        and len(call.args) > 1
        and isinstance(call.args[1], ast.Constant)
    }


def test_every_rule_and_stage_use_the_declared_reads() -> None:
    """Each rule that runs a command is a stage of READS and each stage a rule; the rule's params
    hold `settings("<its name>")` (its own reads, no other stage's), and the module its command
    runs opens that stage's view of the config, and only that one."""
    blocks = _rule_blocks()
    commands = {name: block for name, block in blocks.items() if "shell:" in block}
    assert set(commands) == set(READS)
    for stage, block in commands.items():
        assert re.findall(r"\bsettings\(([^)]*)\)", block) == [f'"{stage}"'], stage
        assert re.search(rf'^\s*settings=settings\("{stage}"\),$', block, re.M), stage
        module = _stage_module(block)
        assert _opened_views(module) == {stage}, f"{stage}: {module} opens {_opened_views(module)}"
