"""Training under ``accelerate launch`` with two processes on this CPU (gloo): DDP, DeepSpeed ZeRO-2
and ZeRO-3 (DeepSpeed's CPU backend), FSDP2 through torchrun, and the `rredcot launch` job path.

What each shows:
- uniform credit is stock GRPO under the same two-process launch (losses and weights identical);
- RREDCoT credit runs on every backend, both processes end with the same weights, the credit
  statistics count the traces of both processes, and ZeRO-2 trains exactly as DDP does;
- FSDP2: the credit passes on a sharded model make no collective call (the processes run different
  numbers of forwards) and give the unsharded model's credit;
- a two-process train job writes its outputs and MLflow run once, and resumes after a SIGKILL.
FSDP through accelerate needs GPUs (accelerate refuses it on a CPU); docs/distributed.md says what
is tested where.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from hangs import HANG_SECONDS
from jobs import CONFIGS, check_resumed, job_env, kill_when_saved, make_base, train_runs, write_config

from rredcot.adapter.distributed import UnsupportedBackend, backend_name, check_backend
from rredcot.tools.launch import free_port

TESTS = Path(__file__).resolve().parent


def _accelerator(processes: int = 2, zero: int | None = None, fsdp: int | None = None) -> SimpleNamespace:
    ds = SimpleNamespace(zero_stage=zero) if zero is not None else None
    fs = SimpleNamespace(fsdp_version=fsdp) if fsdp is not None else None
    return SimpleNamespace(
        state=SimpleNamespace(deepspeed_plugin=ds, fsdp_plugin=fs), num_processes=processes
    )


def test_backends_are_told_apart_and_fsdp1_is_refused():
    assert backend_name(_accelerator(1)) == "single"
    assert backend_name(_accelerator(2)) == "ddp"
    assert backend_name(_accelerator(2, zero=3)) == "zero3"
    assert backend_name(_accelerator(2, fsdp=2)) == "fsdp2"
    check_backend(_accelerator(2, zero=3), gather_zero3=True)
    check_backend(_accelerator(2, fsdp=2), gather_zero3=True)
    with pytest.raises(UnsupportedBackend, match="FSDP2"):
        check_backend(_accelerator(2, fsdp=1), gather_zero3=True)
    with pytest.raises(UnsupportedBackend, match="ds3_gather_for_generation"):
        check_backend(_accelerator(2, zero=3), gather_zero3=False)


EXIT_CHECK = """
import torch, torch.distributed as dist
from rredcot.adapter.distributed import _gloo_workers, settle_gloo_workers
dist.init_process_group("gloo", init_method="file://{store}", rank=0, world_size=1)
dist.all_reduce(torch.ones(4))
assert _gloo_workers(), "no gloo worker threads found by name"
assert settle_gloo_workers(timeout=30)
print("settled")
"""


def test_exit_handler_finds_and_waits_for_the_gloo_workers(tmp_path: Path):
    """The exit handler of a multi-process job (rredcot.adapter.distributed) finds gloo's worker
    threads by the name torch gives them, and returns once they are idle."""
    proc = subprocess.run(
        [sys.executable, "-c", EXIT_CHECK.format(store=tmp_path / "store")],
        env={**job_env(), "PYTHONPATH": _pythonpath()},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and "settled" in proc.stdout, proc.stderr[-2000:]


# ------------------------------------------------------------------------------ two-process runs
@pytest.fixture(scope="module")
def started(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model after a short SFT (so that it writes lines, and segments have something to cut),
    with the RL data."""
    root = make_base(tmp_path_factory.mktemp("mp"))
    cfg = root / "sft.yaml"
    cfg.write_text(
        yaml.safe_dump({"results_dir": str(root / "results"), "sft": {"epochs": 2, "save_every": 0}})
    )
    subprocess.run(
        [sys.executable, "-m", "rredcot.stages.sft", "--config", *CONFIGS, str(cfg)]
        + ["--data", str(root / "sft.jsonl"), "--out", str(root / "sft")],
        env=job_env(),
        check=True,
        capture_output=True,
        timeout=HANG_SECONDS,
    )
    (root / "model").rename(root / "random")
    (root / "sft").rename(root / "model")
    return root


def _pythonpath() -> str:
    """tests/ for the job scripts, then the caller's PYTHONPATH (absolute), so that the processes
    import the same rredcot as this test (e.g. a worktree's src/ rather than the installed one)."""
    caller = [str(Path(p).resolve()) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join([str(TESTS), *caller])


def _launch(mode: str, base: Path, out: Path, accelerate_config: str | None = None) -> list[dict]:
    """tests/multiprocess_job.py under `accelerate launch` with 2 processes; what each process wrote."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch"]
    cmd += ["--config_file", accelerate_config] if accelerate_config else ["--multi_gpu"]
    cmd += ["--num_processes", "2", "--num_machines", "1", "--main_process_port", str(free_port())]
    env = {**job_env(), "DS_ACCELERATOR": "cpu", "PYTHONPATH": _pythonpath()}
    proc = subprocess.run(
        [*cmd, str(TESTS / "multiprocess_job.py"), mode, str(base), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return [json.loads(out.with_name(f"{out.name}.rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.slow
def test_uniform_credit_is_stock_grpo_under_two_processes(started: Path, tmp_path: Path):
    ranks = _launch("uniform", started, tmp_path / "uniform")
    for rank in ranks:
        stock, ours = rank["stock"], rank["ours"]
        assert stock["processes"] == ours["processes"] == 2 and "MULTI_CPU" in stock["backend"]
        assert stock["losses"] == ours["losses"] and len(stock["losses"]) == 3
        assert stock["params"] == ours["params"] != stock["start"]  # identical, and trained
    assert ranks[0]["ours"]["params"] == ranks[1]["ours"]["params"]


def _check_credit(ranks: list[dict]) -> dict:
    """Same weights on both processes (where each has them), and statistics over both processes."""
    ours = [r["ours"] for r in ranks]
    assert all(o["processes"] == 2 for o in ours)
    credit = ours[0]["credit"]
    assert credit == ours[1]["credit"]  # gathered: every process logs the same numbers
    local = [o["local_traces"] for o in ours]
    assert credit["credit/traces"] == [float(a + b) for a, b in zip(*local, strict=True)]
    assert all(n > 0 for n in credit["credit/traces"])
    assert min(credit["credit/sigma_norm_entropy"]) < 1.0  # σ moved away from uniform somewhere
    hashes = [o["params"] for o in ours if o["params"]]
    assert hashes and len(set(hashes)) == 1
    return ours[0]


@pytest.mark.slow
def test_prime_keeps_one_reward_model_on_every_process(started: Path, tmp_path: Path):
    """PRIME under two processes: each keeps a whole implicit reward model and the two average its
    gradients, so after three steps both hold the same reward model, moved from the start, and the
    same policy."""
    ours = [r["ours"] for r in _launch("prime", started, tmp_path / "prime")]
    assert all(o["processes"] == 2 and "MULTI_CPU" in o["backend"] for o in ours)
    assert ours[0]["prm"] is not None and ours[0]["prm"] == ours[1]["prm"] != ours[0]["start"]
    assert ours[0]["params"] == ours[1]["params"] != ours[0]["start"]
    assert ours[0]["prime_loss"] == ours[1]["prime_loss"] and len(ours[0]["prime_loss"]) == 3


@pytest.mark.slow
def test_rredcot_credit_under_ddp_zero2_and_zero3(started: Path, tmp_path: Path):
    pytest.importorskip("deepspeed")
    ddp = _check_credit(_launch("rredcot", started, tmp_path / "ddp"))
    zero2 = _check_credit(_launch("rredcot", started, tmp_path / "zero2", "config/accelerate/zero2.yaml"))
    zero3 = _check_credit(_launch("rredcot", started, tmp_path / "zero3", "config/accelerate/zero3.yaml"))
    assert "DEEPSPEED" in zero2["backend"] and "DEEPSPEED" in zero3["backend"]
    assert zero2["params"] == ddp["params"]  # ZeRO-2 shards Adam states only: the same training
    assert zero3["credit"]["credit/traces"] == ddp["credit"]["credit/traces"]


@pytest.mark.slow
def test_frozen_reference_value_model_under_ddp_and_zero3(started: Path, tmp_path: Path):
    pytest.importorskip("deepspeed")
    policy = _check_credit(_launch("rredcot", started, tmp_path / "policy"))
    ddp = _check_credit(_launch("reference", started, tmp_path / "ref-ddp"))
    zero3 = _check_credit(
        _launch("reference", started, tmp_path / "ref-zero3", "config/accelerate/zero3.yaml")
    )
    # From the second step on the policy has moved away from the frozen start: other values.
    assert ddp["credit"]["credit/exit_log_value"][1:] != policy["credit"]["credit/exit_log_value"][1:]
    assert ddp["params"] != policy["params"]
    assert zero3["credit"]["credit/traces"] == ddp["credit"]["credit/traces"]


@pytest.mark.slow
def test_fsdp2_credit_passes_need_no_collectives(tmp_path: Path):
    out = tmp_path / "fsdp"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_port",
            str(free_port()),
        ]
        + [str(TESTS / "fsdp_scoring.py"), str(out)],
        env={**job_env(), "PYTHONPATH": _pythonpath()},
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS,  # a collective the other process never joins would hang: this fails it
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    ranks = [json.loads(out.with_name(f"{out.name}.rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["traces"] for r in ranks] == [2, 5]
    for r in ranks:
        assert r["max_diff"] < 1e-5 and r["resharded"] and r["forward_ok"]


# ----------------------------------------------------------------------------- the job, end to end
MAX_STEPS, SAVE_EVERY = 8, 2


@pytest.mark.slow
def test_two_process_train_job_writes_once_and_resumes(started: Path, tmp_path: Path):
    """`rredcot launch train` with 2 processes: killed at a checkpoint, run again, resumed; one
    MLflow run, every step once in its outputs, written by the main process only."""
    results, out = tmp_path / "results", tmp_path / "out"
    cfg = write_config(
        tmp_path / "cfg.yaml", results, MAX_STEPS, SAVE_EVERY, distributed={"cpu_processes": 2}
    )
    ckpts = results / "checkpoints" / "train" / "rredcot" / "seed0"
    cmd = [
        *(sys.executable, "-m", "rredcot.cli", "launch", "train", "--config", *CONFIGS, str(cfg)),
        *("--arm", "rredcot", "--seed", "0", "--model", str(started / "model")),
        *("--data", str(started / "rl.jsonl"), "--eval-data", str(started / "test.jsonl"), "--out", str(out)),
        *("--checkpoint-dir", str(ckpts)),
    ]
    with open(tmp_path / "first.log", "w") as log:
        proc = subprocess.Popen(
            cmd, env=job_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        kill_when_saved(proc, ckpts / f"checkpoint-{SAVE_EVERY}")
    assert proc.returncode == -signal.SIGKILL
    first = (tmp_path / "first.log").read_text()
    assert "2 process(es)" in first
    assert not (out / "model").exists() and not (out / "curve.csv").exists()
    run_id = json.loads((ckpts / "job.json").read_text())["mlflow_run_id"]

    again = subprocess.run(cmd, env=job_env(), capture_output=True, text=True, timeout=HANG_SECONDS)
    log = again.stdout + again.stderr
    assert again.returncode == 0, log[-4000:]
    resumed = int(re.search(r"resuming from checkpoint-(\d+)", log).group(1))
    check_resumed(results, out, run_id, resumed, log, MAX_STEPS)  # each step once: one writer
    assert len(re.findall(r"\[train\] rredcot seed 0: ", log)) == 1
    (run,) = train_runs(results)
    assert run.data.metrics["processes"] == 2
    assert not ckpts.exists()
    leftovers = [p.name for p in out.iterdir() if p.name.startswith(".")]
    assert not leftovers, leftovers  # no half-written folder from the other process
    assert os.listdir(out / "model")
