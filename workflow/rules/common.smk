# Shared definitions: validated config, the resolved-config file every stage reads, MLflow grouping.
import os
import time
import uuid

import yaml

from rredcot.config import validate

# Fails here, before any job runs, naming the bad key.
config = validate(config)
R = config["results_dir"]
ARMS = list(config["arms"])
SEEDS = [int(s) for s in config["seeds"]]
PY_CONFIG = f"{R}/config.resolved.yaml"

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


def model_dir(wildcards):
    """The model an evaluation reads: the SFT model for `base`, else the trained arm/seed."""
    if wildcards.arm == "base":
        return f"{R}/models/sft"
    return f"{R}/train/{wildcards.arm}/seed{wildcards.seed}/model"
