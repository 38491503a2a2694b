"""Each study reads exactly the settings rredcot.settings.reads declares for it.

Every study runs once (twice for the PRM's two kinds) on a tiny model with every lookup of its
config view recorded: the declared keys it read must be all of its declared keys, computes and
runs, and no other (a study handed a setting as a flag instead would leave its declared key unread;
one that read an undeclared setting would fail with UndeclaredSetting). The workflow side, that the
study rules pass no setting as a flag, is in test_workflow.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tiny_models import TINY_SETTINGS

from rredcot.data.synthetic import TaskConfig, generate_splits
from rredcot.infra.io import read_jsonl, write_jsonl
from rredcot.lm.modeling import build_scratch_model, train_tokenizer
from rredcot.settings.reads import READS, StageView
from rredcot.studies import (
    attribution,
    fidelity,
    figures_attr,
    figures_mc,
    localisation,
    mc,
    prm,
    prm_train,
    problems,
    traces,
)
from rredcot.studies.prm import StepScores

ROOT = Path(__file__).resolve().parents[1]
TINY = TINY_SETTINGS
# The studies shrunk to a few seconds each.
STUDIES = {
    "n_traces": 4,
    "localisation_traces": 4,
    "max_new_tokens": 24,
    "mc_samples": 2,
    "mc_max_new_tokens": 12,
    "bootstrap": 10,
    "prm": {"n_traces": 4, "epochs": 1, "batch_size": 4, "analysis_problems": 4},
    "fidelity": {"traces": 3, "mc_samples": [1]},
}


@contextlib.contextmanager
def recorded() -> Iterator[set[tuple[str, str]]]:
    """(stage, dotted key) of every declared setting read from a stage's view while open: a lookup
    that reaches a declared key (a value, or a whole declared section), directly or by iterating
    the view that holds it (dict(), json, ``|`` on a copy ...)."""
    reads: set[tuple[str, str]] = set()
    plain = {name: getattr(dict, name) for name in ("__getitem__", "__iter__", "keys", "items", "values")}

    def note(view: StageView, key: Any, value: Any) -> Any:
        if not isinstance(value, StageView):  # a view is a step towards a declared key, not one
            reads.add((view.stage, f"{view.where}.{key}" if view.where else str(key)))
        return value

    def every(view: StageView) -> None:
        for key in plain["keys"](view):
            note(view, key, plain["__getitem__"](view, key))

    def getitem(view: StageView, key: Any) -> Any:
        return note(view, key, plain["__getitem__"](view, key))

    def iterate(view: StageView) -> Iterator[Any]:
        every(view)
        return plain["__iter__"](view)

    def keys(view: StageView) -> Any:
        every(view)
        return plain["keys"](view)

    def items(view: StageView) -> Any:
        every(view)
        return plain["items"](view)

    def values(view: StageView) -> Any:
        every(view)
        return plain["values"](view)

    with pytest.MonkeyPatch.context() as patch:
        for name, fn in (
            ("__getitem__", getitem),
            ("__iter__", iterate),
            ("keys", keys),
            ("items", items),
            ("values", values),
        ):
            patch.setattr(StageView, name, fn)
        yield reads


def declared(stage: str, variant: str | None = None) -> set[str]:
    """Every key ``stage`` declares, computes and runs: of every variant, or of ``variant`` only."""
    reads = READS[stage]
    chosen = [keys for name, keys in reads.variants.items() if variant in (None, name)]
    return {*reads.computes, *reads.runs, *(key for keys in chosen for key in keys)}


class FakeHubPRM:
    """Stands in for a hub PRM (kind qwen-prm): scores without a download."""

    def __init__(self, path: str) -> None:
        self.path = path

    def score(self, steps: Any, given_answer: bool = False) -> list[StepScores]:
        return [StepScores([0.5] * len(t.steps)) for t in steps]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[str, set[str]]]]:
    """Stage -> (what the run was, the declared keys it read) for every run of the study pipeline."""
    root = tmp_path_factory.mktemp("study-reads")
    splits = generate_splits(TaskConfig(n_sft=300, n_rl=12, n_test=12, seed=3))
    corpus = [f"Problem: {r['problem']}\n<think>\n{r['completion']}" for r in splits["sft"]]
    tok = train_tokenizer(corpus, 300)
    model = build_scratch_model(tok, TINY, seed=0)
    model.save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    for split in ("rl", "test"):
        write_jsonl(root / f"{split}.jsonl", splits[split])
    override = {
        "results_dir": str(root / "results"),
        "credit": {"segmentation": {"n_segments": 3}},
        "studies": STUDIES,
    }
    (root / "override.yaml").write_text(yaml.safe_dump(override))
    cfg = ["--config", str(ROOT / "config" / "config.yaml"), str(root / "override.yaml")]
    model_dir, s = str(root / "model"), root / "studies"
    out: dict[str, list[tuple[str, set[str]]]] = {}

    def run(stage: str, label: str, main: Any, argv: list[str]) -> None:
        with recorded() as reads:
            main([*cfg, *argv])
        assert {st for st, _ in reads} <= {stage}, reads  # a study opens its own view only
        out.setdefault(stage, []).append((label, {key for _, key in reads}))

    with pytest.MonkeyPatch.context() as env:
        env.delenv("MLFLOW_TRACKING_URI", raising=False)
        env.setenv("RREDCOT_INVOCATION", "study-reads-test")
        fresh = str(root / "study.jsonl")
        run("study_problems", "", problems.main, ["--out", fresh])
        assert len(read_jsonl(fresh)) == STUDIES["prm"]["analysis_problems"]
        for name in ("analysis", "prm", "localisation", "prm_analysis"):
            data = {"prm": str(root / "rl.jsonl"), "prm_analysis": fresh}.get(name, str(root / "test.jsonl"))
            argv = ["--set", name, "--model", model_dir, "--data", data, "--out", str(s / name / "t.jsonl")]
            run("study_traces", name, traces.main, argv)
        for name in ("analysis", "prm"):
            t = str(s / name / "t.jsonl")
            mc_out = ["--out", str(s / name / "mc.jsonl"), "--stats", str(s / name / "mc.json")]
            run("study_mc", name, mc.main, ["--model", model_dir, "--traces", t, *mc_out])
        a = {k: str(s / "analysis" / f) for k, f in (("t", "t.jsonl"), ("mc", "mc.jsonl"), ("st", "mc.json"))}
        run(
            "study_mc_figures",
            "",
            figures_mc.main,
            ["--traces", a["t"], "--mc", a["mc"], "--mc-stats", a["st"], "--out-dir", str(s / "fig")],
        )
        attr = str(s / "attributions.jsonl")
        run(
            "study_attribution",
            "",
            attribution.main,
            ["--model", model_dir, "--traces", a["t"], "--mc", a["mc"], "--out", attr],
        )
        prm_dir = str(s / "prm" / "model")
        p = {k: str(s / "prm" / f) for k, f in (("t", "t.jsonl"), ("mc", "mc.jsonl"))}
        run(
            "study_prm_train",
            "",
            prm_train.main,
            ["--model", model_dir, "--traces", p["t"], "--mc", p["mc"], "--out", prm_dir],
        )
        scores = str(s / "prm.jsonl")
        run("study_prm", "local", prm.main, ["--prm", prm_dir, "--traces", a["t"], "--out", scores])
        # kind qwen-prm loads studies.prm.name_or_path (a stand-in here, not the hub model).
        (root / "hub.yaml").write_text(yaml.safe_dump({"studies": {"prm": {"kind": "qwen-prm"}}}))
        env.setattr(prm, "load_scorer", lambda kind, path, dtype, budget: FakeHubPRM(path))
        hub = ["--traces", a["t"], "--out", str(s / "hub.jsonl")]
        run("study_prm", "qwen-prm", prm.main, [str(root / "hub.yaml"), *hub])
        run(
            "study_attr_figures",
            "",
            figures_attr.main,
            ["--attributions", attr, "--prm", scores, "--out-dir", str(s / "fig")],
        )
        fid = ["--json", str(s / "f.json"), "--csv", str(s / "f.csv"), "--figure", str(s / "f.png")]
        run(
            "study_fidelity",
            "",
            fidelity.main,
            ["--model", model_dir, "--traces", a["t"], "--data", str(root / "test.jsonl"), *fid],
        )
        run(
            "study_localisation",
            "",
            localisation.main,
            ["--traces", str(s / "localisation" / "t.jsonl"), "--out", str(s / "loc.json")],
        )
    assert read_jsonl(scores) and read_jsonl(s / "hub.jsonl")  # the PRM runs scored something
    return out


STUDIES_OF_READS = sorted(stage for stage in READS if stage.startswith("study_"))


def test_every_study_is_run() -> None:
    assert STUDIES_OF_READS == [
        "study_attr_figures",
        "study_attribution",
        "study_fidelity",
        "study_localisation",
        "study_mc",
        "study_mc_figures",
        "study_prm",
        "study_prm_train",
        "study_problems",
        "study_traces",
    ]


@pytest.mark.parametrize("stage", STUDIES_OF_READS)
def test_a_study_reads_what_it_declares(runs: dict[str, list[tuple[str, set[str]]]], stage: str) -> None:
    variants = READS[stage].variants
    seen: set[str] = set()
    for label, reads in runs[stage]:
        if variants:  # a variant reads its own keys, and no other variant's
            assert reads == declared(stage, label), label
        assert reads <= declared(stage), label
        seen |= reads
    # Over its runs (the PRM's two kinds read one setting each of their own), every declared key.
    missing = declared(stage) - seen if not variants else set()
    assert not missing, f"{stage} never read {sorted(missing)}: read it from the config or drop it from READS"
