"""Running real training jobs in tests: a tiny start model on disk, killing a job at a checkpoint,
and checking that a resumed job's outputs and MLflow run hold every step exactly once."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml
from hangs import HANG_SECONDS
from mlflow import MlflowClient

from rredcot.data.synthetic import TaskConfig, generate_splits
from rredcot.infra.io import write_jsonl
from rredcot.infra.resume import check_checkpoint, is_resumable
from rredcot.infra.tracking import INVOCATION_ENV, tracking_uri
from rredcot.lm.modeling import build_scratch_model, train_tokenizer
from rredcot.settings.config import load_config

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = [str(ROOT / "config" / "config.yaml"), str(ROOT / "config" / "smoke.yaml")]


def make_base(root: Path) -> Path:
    """A tiny random model with its tokenizer, and SFT, RL and held-out data, saved as the pipeline
    would: ``root/model``, ``root/{sft,rl,test}.jsonl``."""
    cfg = load_config(CONFIGS)
    splits = generate_splits(TaskConfig(n_sft=200, n_rl=60, n_test=10, seed=3))
    template = cfg["prompt"]["template"]
    tok = train_tokenizer(
        [template.replace("{problem}", r["problem"]) + r["completion"] for r in splits["sft"]], 300
    )
    model = build_scratch_model(tok, cfg["model"], seed=0)
    model.save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    for name in ("sft", "rl", "test"):
        write_jsonl(root / f"{name}.jsonl", splits[name])
    return root


def write_config(path: Path, results: Path, max_steps: int, save_every: int, **extra: object) -> Path:
    """The smoke config with a results dir of its own and enough steps to be killed half way."""
    path.write_text(
        yaml.safe_dump(
            {"results_dir": str(results), "rl": {"max_steps": max_steps, "save_every": save_every}, **extra}
        )
    )
    return path


def job_env() -> dict[str, str]:
    """Each command is a new invocation on the sqlite store, as a rerun of the workflow would be."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop(INVOCATION_ENV, None)
    return env


def descendants(pid: int) -> list[int]:
    """Ids of the processes started by ``pid``, recursively (Linux /proc)."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            found += [child, *descendants(child)]
    return found


def kill_when_saved(proc: subprocess.Popen, checkpoint: Path, timeout: float = HANG_SECONDS) -> None:
    """SIGKILL ``proc`` and everything it started as soon as ``checkpoint`` is complete (a job that
    neither saves it nor ends within ``timeout`` seconds hangs). Complete means sealed, as resuming
    requires (:func:`rredcot.infra.resume.check_checkpoint`)."""
    t0 = time.monotonic()
    while check_checkpoint(checkpoint) is not None or not is_resumable(checkpoint):
        assert proc.poll() is None, f"the job ended (rc {proc.returncode}) before {checkpoint} was saved"
        assert time.monotonic() - t0 < timeout, f"{checkpoint} was not saved in {timeout} s"
        time.sleep(0.02)
    tree = descendants(proc.pid)
    os.killpg(proc.pid, signal.SIGKILL)  # the process group of start_new_session=True ...
    for pid in tree:  # ... and anything that left it
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def train_runs(results: Path, experiment: str = "rredcot-smoke") -> list:
    client = MlflowClient(tracking_uri(results))
    exp = client.get_experiment_by_name(experiment)
    return client.search_runs([exp.experiment_id], "tags.`rredcot.rule` = 'train'")


def check_resumed(results: Path, out: Path, run_id: str, resumed: int, log: str, max_steps: int) -> None:
    """One run, continued: every step once in the curve, metrics and MLflow; only the rest retrained."""
    assert f"resuming from checkpoint-{resumed}" in log
    probed = [int(s) for s in re.findall(r"\[train\] step (\d+):", log)]
    assert probed == list(range(resumed + 1, max_steps + 1))  # no step before the checkpoint again

    curve = (out / "curve.csv").read_text().splitlines()
    assert [int(row.split(",")[2]) for row in curve[1:]] == list(range(max_steps + 1))
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in logged if "loss" in m] == list(range(1, max_steps + 1))
    assert (out / "model" / "model.safetensors").exists()

    client = MlflowClient(tracking_uri(results))
    (run,) = train_runs(results)
    assert run.info.run_id == run_id and run.info.status == "FINISHED"
    assert run.data.tags["rredcot.attempt"] == "2"
    assert run.data.tags["rredcot.resumed_from"] == f"checkpoint-{resumed}"
    assert run.data.metrics["resumed_from_step"] == resumed
    assert run.data.metrics["steps_this_attempt"] == max_steps - resumed
    for key, first in (("heldout_greedy_accuracy", 0), ("perf/step_seconds", 1), ("loss", 1)):
        steps = [m.step for m in client.get_metric_history(run_id, key)]
        assert sorted(steps) == list(range(first, max_steps + 1)), key  # each step exactly once
    # The killed invocation's parent ends once its job has moved to the new invocation.
    parents = client.search_runs([run.info.experiment_id], "tags.`rredcot.kind` = 'invocation'")
    assert len(parents) == 2 and {p.info.status for p in parents} == {"FINISHED"}
