"""A real tracking server for tests: ``rredcot tracking server`` on loopback and a free port."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from hangs import HANG_SECONDS

from rredcot.tools.launch import free_port


@contextlib.contextmanager
def serve(tmp_path: Path, *options: str) -> Iterator[tuple[str, Path, subprocess.Popen]]:
    """A tracking server started with `rredcot tracking server [options]` (perhaps still booting);
    its URI, results dir and process. Stopped, with all its processes, at the end."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    results = tmp_path / "results"
    log_path = tmp_path / "server.log"
    rredcot = Path(sys.executable).parent / "rredcot"
    cmd = [rredcot, "tracking", "server", "--results-dir", results, "--port", str(free_port()), *options]
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # one process group: stopping it stops the server's workers too
        )
    try:
        deadline = time.monotonic() + HANG_SECONDS
        # Printed before the server starts (it then runs the migrations of a fresh database).
        while not (uri := re.search(r"^export MLFLOW_TRACKING_URI=(\S+)$", log_path.read_text(), re.M)):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"no URI printed:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.1)
        yield uri.group(1), results, proc
        with urllib.request.urlopen(f"{uri.group(1)}/health", timeout=HANG_SECONDS) as response:
            assert response.status == 200, log_path.read_text()[-3000:]  # still up after the load
    finally:
        stop_server(proc)


def stop_server(proc: subprocess.Popen, timeout: float = 15) -> None:
    """Stop a server started in a process group of its own, with its workers: SIGTERM, then SIGKILL
    after ``timeout`` seconds."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
