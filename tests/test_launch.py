"""`rredcot launch` plans a job's processes from its resources, without starting anything."""

from __future__ import annotations

import pytest

import rredcot.tools.launch as L
from rredcot.settings.config import load_config

CONFIG = "config/config.yaml"


def _cfg(**distributed):
    overrides = {"distributed": distributed}
    if distributed.pop("server", False):
        overrides["rl"] = {"gpu": {"use_vllm": True, "vllm_mode": "server"}}
    return load_config(CONFIG, overrides)


def _served_model(command: list[str]) -> str:
    """The model of `vllm serve MODEL`, or of the module form vLLM's CPU build needs (--model MODEL)."""
    at = command.index("serve") if "serve" in command else command.index("--model")
    return command[at + 1]


def test_the_default_runs_in_this_process():
    plan = L.plan_launch(_cfg(), "train", "m", env={}, cuda_count=0)
    assert plan.in_process and plan.processes == 1 and not plan.cuda


def test_cpu_processes_use_gloo_ddp():
    plan = L.plan_launch(_cfg(cpu_processes=2), "train", "m", env={}, cuda_count=0)
    cmd = L.stage_command(plan, _cfg(), ["--config", "c"])
    assert not plan.in_process and plan.processes == 2
    assert cmd[cmd.index("--num_processes") + 1] == "2" and "--multi_gpu" in cmd
    assert cmd[-4:] == ["-m", "rredcot.stages.train", "--config", "c"]


def test_one_process_per_visible_gpu_with_the_named_accelerate_config():
    cfg = _cfg(accelerate_config="config/accelerate/zero3.yaml", gpus_per_node=4)
    plan = L.plan_launch(cfg, "train", "m", env={"CUDA_VISIBLE_DEVICES": "3,5,6,7"}, cuda_count=4)
    assert plan.processes == 4 and plan.train_gpus == ["3", "5", "6", "7"] and plan.server is None
    cmd = L.stage_command(plan, cfg, [])
    assert cmd[cmd.index("--config_file") + 1] == "config/accelerate/zero3.yaml"


def test_vllm_server_takes_the_last_gpus_of_a_single_node():
    cfg = _cfg(accelerate_config="config/accelerate/zero3.yaml", gpus_per_node=8, server=True)
    plan = L.plan_launch(cfg, "train", "/models/start", env={}, cuda_count=8)
    assert plan.processes == 7 and plan.train_gpus == [str(i) for i in range(7)]
    assert plan.server.gpus == ["7"] and plan.server.host == "127.0.0.1"
    assert _served_model(plan.server.command) == "/models/start"
    assert "--weight-transfer-config" in plan.server.command  # TRL's flags, from TRL's own builder
    # SFT never starts a server
    assert L.plan_launch(cfg, "sft", "/models/start", env={}, cuda_count=8).server is None


def test_a_server_needs_a_gpu_left_for_training():
    cfg = _cfg(gpus_per_node=1, server=True)
    with pytest.raises(SystemExit, match="at least one for training"):
        L.plan_launch(cfg, "train", "m", env={}, cuda_count=1)


def test_two_jobs_on_one_node_get_their_own_ports_unless_the_config_names_them():
    cfg = _cfg(gpus_per_node=2, server=True)
    plans = [L.plan_launch(cfg, "train", "m", env={}, cuda_count=2) for _ in range(2)]
    ports = [p for plan in plans for p in (plan.server.port, plan.server.group_port)]
    assert len(set(ports)) == 4
    fixed = _cfg(gpus_per_node=2, server=True, vllm_server={"port": 8123, "group_port": 51300})
    plan = L.plan_launch(fixed, "train", "m", env={}, cuda_count=2)
    assert (plan.server.port, plan.server.group_port) == (8123, 51300)
    assert plan.server.command[plan.server.command.index("--port") + 1] == "8123"


def test_a_cpu_job_runs_its_server_on_the_cpu_beside_training(capsys):
    cfg = _cfg(server=True)
    plan = L.plan_launch(cfg, "train", "/models/start", env={}, cuda_count=0)
    assert plan.server.gpus == [] and plan.server.host == "127.0.0.1" and plan.processes == 1
    assert not plan.in_process  # the launcher keeps the server while the stage runs
    assert "--enforce-eager" in plan.server.command
    env = L.server_environment(plan, cfg, {})
    assert env["VLLM_CPU_KVCACHE_SPACE"] == str(cfg["vllm_cpu"]["kv_cache_gib"])
    assert "CUDA_VISIBLE_DEVICES" not in env and env["VLLM_SERVER_DEV_MODE"] == "1"
    assert L.run(plan, cfg, ["--config", "c"], server_log=None, dry_run=True) == 0
    printed = capsys.readouterr().out
    assert "server: " in printed and f"--port {plan.server.port}" in printed


def test_several_nodes_launch_through_srun(monkeypatch, capsys):
    monkeypatch.setattr(L, "_slurm_nodes", lambda env: ["gpu01", "gpu02", "gpu03"])
    cfg = _cfg(accelerate_config="config/accelerate/zero3.yaml", gpus_per_node=8, nodes=3, server=True)
    env = {"SLURM_JOB_NUM_NODES": "3", "SLURM_JOB_NODELIST": "gpu[01-03]"}
    plan = L.plan_launch(cfg, "train", "m", env=env, cuda_count=8)
    # The last node serves vLLM on all its GPUs; the other two train, 8 processes each.
    assert (plan.nodes, plan.processes_per_node, plan.processes) == (2, 8, 16)
    assert plan.server.node == "gpu03" and plan.server.host == "gpu03"
    assert plan.node_names == ["gpu01", "gpu02"]
    assert L.run(plan, cfg, ["--config", "c"], server_log=None, dry_run=True) == 0
    printed = capsys.readouterr().out
    assert "srun --nodes=2 --ntasks-per-node=1 --nodelist=gpu01,gpu02" in printed
    assert "--machine_rank $SLURM_NODEID --main_process_ip gpu01" in printed
    assert "server: srun --nodes=1 --ntasks=1 --nodelist=gpu03" in printed


def test_the_node_count_must_match_the_job():
    cfg = _cfg(nodes=2)
    with pytest.raises(SystemExit, match="has 1 node"):
        L.plan_launch(cfg, "train", "m", env={"SLURM_JOB_NUM_NODES": "1"}, cuda_count=8)


# The stage, stood in for by a process that reports how it starts and, on SIGTERM, stops as a
# training process does (after a moment, with a failure code).
_STAGE = """
import os, signal, sys, time
ignored = signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN
# os.write, not print: the signal may come while print still holds stdout's buffer (reentrant call)
signal.signal(signal.SIGTERM, lambda *a: (os.write(1, b"term\\n"), time.sleep(0.5), sys.exit(3)))
print("usr1-ignored" if ignored else "usr1-default", flush=True)
time.sleep(60)
sys.exit(0)
"""
_LAUNCHER = """
import sys
from rredcot.tools.launch import call_until_stopped
print("launcher-exit", call_until_stopped([sys.executable, "-c", sys.argv[1]], {}), flush=True)
"""


def test_a_stop_signal_to_the_launcher_stops_the_stage_and_exits_75():
    """SLURM's SIGTERM/SIGUSR1 must not end `rredcot launch` while the stage still saves: it passes
    SIGTERM on (SIGUSR1 would end `accelerate launch`), waits, and exits 75 (rerun the job)."""
    import signal
    import subprocess
    import sys

    from rredcot.infra.stopping import PREEMPTED_EXIT

    proc = subprocess.Popen([sys.executable, "-c", _LAUNCHER, _STAGE], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "usr1-ignored"  # the stage has started
    proc.send_signal(signal.SIGUSR1)
    out, _ = proc.communicate(timeout=60)
    assert out.split() == ["term", "launcher-exit", str(PREEMPTED_EXIT)] and proc.returncode == 0
