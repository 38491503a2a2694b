"""A train job's vLLM server on this CPU, as `rredcot launch` runs it, and what reaches it.

Run by tests/test_vllm.py as ``python tests/vllm_server_job.py MODEL RUN OUT CONFIG...`` (RUN: a
results folder with ``data/rl.clean.jsonl`` and ``data/test.jsonl``; CONFIG: config files with
``rl.gpu.vllm_mode: server``). Inside :func:`rredcot.tools.launch.serving` (the server started on the
plan's free ports, answering ``/health``):

1. RREDCoT's greedy answer baseline with its solutions written by the server (``ServerDecoder``)
   against transformers' own decoding, on sampled traces;
2. the train stage against the server, as `rredcot launch` starts it (the server's address in the
   environment): TRL's trainer connects, then stops where it pushes weights over NCCL, which needs
   CUDA.

Writes ``OUT/server.json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import torch
from vllm_checks import compare_baselines, credit_traces

from rredcot.adapter.engine import ServerDecoder
from rredcot.data.records import build_prompts
from rredcot.infra.io import read_jsonl
from rredcot.lm.generation import HFGenerator
from rredcot.lm.modeling import load_model, load_tokenizer
from rredcot.settings.config import credit_config, load_config
from rredcot.tools import launch as L


def main(model_dir: str, run: str, out: str, *configs: str) -> None:
    torch.set_num_threads(1)
    cfg = load_config(configs)
    plan = L.plan_launch(cfg, "train", model_dir, env={}, cuda_count=0)
    assert plan.server is not None and not plan.server.gpus
    report: dict = {"port": plan.server.port, "group_port": plan.server.group_port}
    env = {
        **os.environ,
        "RREDCOT_VLLM_HOST": plan.server.host,
        "RREDCOT_VLLM_PORT": str(plan.server.port),
        "RREDCOT_VLLM_GROUP_PORT": str(plan.server.group_port),
    }
    with L.serving(plan, cfg, Path(out) / "server.log", env):
        with urllib.request.urlopen(f"http://127.0.0.1:{plan.server.port}/health", timeout=10) as resp:
            report["health"] = resp.status
        from trl.generation.vllm_client import VLLMClient

        tok = load_tokenizer(model_dir)
        model = load_model(model_dir, "float32").eval()
        rows = read_jsonl(Path(run) / "data/test.jsonl")[:20]
        prompts = build_prompts(cfg["prompt"], [r["problem"] for r in rows], tok)
        items = credit_traces(HFGenerator(model, tok, batch_size=64), tok, rows, prompts)
        client = VLLMClient(base_url=f"http://127.0.0.1:{plan.server.port}", connection_timeout=60)
        compared = compare_baselines(model, tok, items, credit_config(cfg, "rredcot"), ServerDecoder(client))
        report["heads"] = compared["with_answer_segment"]
        report["solutions_identical"] = compared["solutions_identical"]
        report["baseline"] = compared
        stage = [sys.executable, "-m", "rredcot.stages.train", "--config", *configs, "--arm", "rredcot"]
        stage += ["--seed", "0", "--model", model_dir, "--data", str(Path(run) / "data/rl.clean.jsonl")]
        stage += ["--eval-data", str(Path(run) / "data/test.jsonl"), "--out", str(Path(out) / "train")]
        proc = subprocess.run(stage, env=env, capture_output=True, text=True, timeout=600)
        report["train_returncode"] = proc.returncode
        report["train_error"] = proc.stderr[-3000:]
    (Path(out) / "server.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:4], *sys.argv[4:])
