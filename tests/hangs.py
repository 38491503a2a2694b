"""The tests' wall-clock bounds: they catch a command that hangs, never one that is slow.

A test must not fail because the machine is slow or busy (a 2-core laptop running another test suite
beside it). So no test compares a duration with a budget: a single command or wait gets
:data:`HANG_SECONDS`, far beyond what any of them needs, and a long run (a workflow) is killed only
when it stops making progress (:func:`run_until_stalled`), however long it takes while it moves.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HANG_SECONDS = 30 * 60
"""A command or wait that has not finished after this long hangs. The slowest single job of the tests
takes a few minutes on a busy 2-core machine."""

_POLL_SECONDS = 2.0


def _state(paths: Sequence[Path]) -> tuple[int, int, int]:
    """(files, bytes, newest mtime) under ``paths``: changes whenever a file there is written."""
    files = size = newest = 0
    stack = [Path(p) for p in paths]
    while stack:
        path = stack.pop()
        try:
            if path.is_dir():
                stack += list(path.iterdir())
                continue
            stat = path.stat()
        except OSError:  # gone meanwhile, or never there
            continue
        files, size, newest = files + 1, size + stat.st_size, max(newest, stat.st_mtime_ns)
    return files, size, newest


def run_until_stalled(
    cmd: Sequence[str | Path],
    watch: Sequence[Path],
    stall: float = HANG_SECONDS,
    output_is_progress: bool = True,
    **popen: Any,
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` to its end, stdout and stderr captured as text, as ``subprocess.run`` would.

    It is killed (with its whole process group) only when it stops making progress: no file under
    ``watch`` (and, if ``output_is_progress``, nothing in its output) has changed for ``stall``
    seconds; its stderr then ends with a line that says so. A command that keeps printing while it
    hangs (a status poll) must be watched by its files alone: ``output_is_progress=False``."""
    with tempfile.TemporaryDirectory() as tmp:
        out_path, err_path = Path(tmp) / "stdout", Path(tmp) / "stderr"
        outputs = [out_path, err_path] if output_is_progress else []
        with out_path.open("w") as out, err_path.open("w") as err:
            proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, start_new_session=True, **popen)
            try:
                seen, since = None, time.monotonic()
                while True:
                    try:
                        proc.wait(timeout=_POLL_SECONDS)
                        break
                    except subprocess.TimeoutExpired:
                        pass
                    if (now := _state([*outputs, *watch])) != seen:
                        seen, since = now, time.monotonic()
                    elif time.monotonic() - since > stall:
                        os.killpg(proc.pid, signal.SIGKILL)
                        proc.wait()
                        err.write(f"\n[killed after {stall:.0f} s without progress]\n")
                        break
            finally:
                if proc.poll() is None:  # the test itself was interrupted: leave nothing running
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        stdout, stderr = out_path.read_text(), err_path.read_text()
    return subprocess.CompletedProcess(list(cmd), proc.returncode, stdout, stderr)
