# Shared definitions: validated config, the resolved-config file every stage reads, MLflow grouping.
import os
import sys
import time
import uuid

import yaml

from rredcot.settings.config import active_arms, pretrained_path, validate
from rredcot.settings.preflight import (
    check_model_source,
    check_vllm,
    cpu_dtype_warning,
    cpu_has_bfloat16,
)
from rredcot.settings.reads import READS, stage_settings

# Fails here, before any job runs, naming the bad key.
config = validate(config)
R = config["results_dir"]
ARMS = active_arms(config)
SEEDS = [int(s) for s in config["seeds"]]
PY_CONFIG = f"{R}/config.resolved.yaml"

# Before the first job (not in a dry run: `-n` shows any recipe's plan on any machine): a model from
# a GGUF file needs its package installed; vLLM stages need vLLM installed, and where their jobs run
# on this CPU, a model and memory it can serve. bfloat16 on a CPU that emulates it is a warning.
onstart:
    import torch

    check_model_source(config)
    check_vllm(config, cuda=torch.cuda.is_available(), local=workflow.local_exec)
    slow = cpu_dtype_warning(
        config, torch.cuda.is_available(), workflow.local_exec, cpu_has_bfloat16()
    )
    if slow:
        print(f"WARNING: {slow}", file=sys.stderr)


# All jobs of one invocation share this id (inherited through the environment, also by SLURM jobs),
# so their MLflow runs are grouped under one parent run.
os.environ.setdefault(
    "RREDCOT_INVOCATION", time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
)


def _write_resolved_config():
    """Write the merged, validated config once; rewrite only when it changes (stable mtime)."""
    # Key order is kept: the order of the arms is the order of table columns and legends.
    text = yaml.safe_dump(config, sort_keys=False)
    path = Path(PY_CONFIG)
    if path.exists() and path.read_text() == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:6]}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


_write_resolved_config()


wildcard_constraints:
    arm="|".join(ARMS),
    seed=r"\d+",


# Train and SFT jobs run through `rredcot launch` on the resources the config asks for: GPUs per node
# (the `gpu` resource, --gpus on SLURM) and nodes; several nodes make it an `srun` job of its own
# (the executor's mpi route: the command runs once in the allocation and starts a launcher per node).
DIST = config["distributed"]


# Each rule's `settings` param: the settings its stage computes with (rredcot.settings.reads, the same
# list the stage is held to and its resume fingerprint uses), so a change reruns exactly the jobs
# that read it.
def settings(stage):
    variant = (lambda wc: wc.set) if READS[stage].variants else (lambda wc: None)
    return lambda wc: stage_settings(
        config, stage, getattr(wc, "arm", None), variant(wc)
    )


def launch_resources():
    if DIST["nodes"] == 1:
        return {"gpu": DIST["gpus_per_node"]}
    return {
        "nodes": DIST["nodes"],
        "tasks": DIST["nodes"],
        "tasks_per_gpu": 0,
        "mpi": "srun",
        "gres": f"gpu:{DIST['gpus_per_node']}",
    }


def launch_threads(stage):
    """CPU threads of a launched job: the stage's threads for each process on a node."""
    return config["threads"][stage] * max(DIST["gpus_per_node"], DIST["cpu_processes"])


SYNTHETIC = config["data"]["kind"] == "synthetic"
BENCHMARKS = [] if SYNTHETIC else list(config["data"]["benchmarks"])
TABLE = f"{R}/{config['report']['table']}"
# A pretrained model (model.kind pretrained): a hub id or local path that Snakemake does not track,
# or the checkpoint the model rule converts from model.gguf, which it does.
PRETRAINED = (
    pretrained_path(config) if config["model"]["kind"] == "pretrained" else None
)
PRETRAINED_INPUT = [PRETRAINED] if config["model"]["gguf"] else []
# The model RL starts from: the SFT warm-up, or the pretrained model when sft.enabled is false.
START_MODEL = f"{R}/models/sft" if config["sft"]["enabled"] else PRETRAINED


def start_model_input(wildcards):
    """The model RL starts from as a tracked input, where it is a file of this workflow."""
    return [START_MODEL] if config["sft"]["enabled"] else PRETRAINED_INPUT


def model_dir(wildcards):
    """The model an evaluation reads: the model RL starts from for `base`, else the trained method/seed."""
    if wildcards.arm == "base":
        return start_model_input(wildcards)
    return [f"{R}/train/{wildcards.arm}/seed{wildcards.seed}/model"]


def model_arg(wildcards):
    """The --model argument of an evaluation (the model RL starts from may be a hub id)."""
    if wildcards.arm == "base":
        return START_MODEL
    return f"{R}/train/{wildcards.arm}/seed{wildcards.seed}/model"


def fetch_name(stem):
    """Data file stem -> dataset name in the config: rl = train, test = heldout, bench/NAME = NAME."""
    return {"rl": "train", "test": "heldout"}.get(stem, stem.removeprefix("bench/"))


def eval_data(wildcards):
    """What an evaluation reads: the synthetic test split, or one file per configured benchmark."""
    if SYNTHETIC:
        return [f"{R}/data/test.jsonl"]
    return [f"{R}/data/bench/{b}.jsonl" for b in BENCHMARKS]


# The analyses (studies.smk): where their files go, and which inputs they read.
STUDY = f"{R}/studies"
FIG = f"{R}/figures"
S = config["studies"]
STUDY_FIGURES = [
    f"{FIG}/{name}.{ext}"
    for name in (
        "fig3_truncation",
        "fig4_attribution_correlation",
        "fig5_prm_vs_nll",
        "fig6_prm_vs_rredcot",
        "fig7_mc_variance",
    )
    for ext in ("png", "pdf")
]
# Only the synthetic task knows where a wrong trace goes wrong.
STUDY_LOCALISATION = [f"{STUDY}/localisation/localisation.json"] if SYNTHETIC else []


# The traces the PRM study scores (Figures 5-6): the analysis traces, or one each of the study
# split's fresh problems (studies.prm.analysis_problems, synthetic task only).
PRM_SET = "prm_analysis" if S["prm"]["analysis_problems"] else "analysis"


def study_data(wildcards):
    """Problems the study traces are drawn from: held-out ones, the RL split for PRM training, or the
    study split for the PRM study."""
    if wildcards.set == "prm":
        return [f"{R}/data/rl.clean.jsonl"]
    if wildcards.set == "prm_analysis":
        return [f"{R}/data/study.jsonl"]
    return eval_data(wildcards)


def prm_model(wildcards):
    """The PRM: trained here (kind local) or a hub checkpoint that Snakemake does not track."""
    return [f"{STUDY}/prm/model"] if S["prm"]["kind"] == "local" else []
