"""The hang bound of long test runs (tests/hangs.py): a command that stops making progress is killed."""

from __future__ import annotations

import sys
from pathlib import Path

from hangs import run_until_stalled


def test_a_command_without_progress_is_killed_and_says_so(tmp_path: Path) -> None:
    # It prints (a status poll, say) but writes nothing under the watched folder.
    poll = "import time\nwhile True:\n    print('waiting', flush=True)\n    time.sleep(0.1)"
    cmd = [sys.executable, "-c", poll]
    proc = run_until_stalled(cmd, watch=[tmp_path], stall=1, output_is_progress=False)
    assert proc.returncode < 0
    assert proc.stderr.endswith("[killed after 1 s without progress]\n")


def test_a_command_that_ends_keeps_its_output_and_exit_status(tmp_path: Path) -> None:
    script = "import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.exit(3)"
    proc = run_until_stalled([sys.executable, "-c", script], watch=[tmp_path / "missing"])
    assert (proc.returncode, proc.stdout, proc.stderr) == (3, "out\n", "err\n")
