"""The example of docs/library.md runs as a user would run it: a plain TRL GRPO script with the
marked lines changed trains two steps with RREDCoT credit (a fresh interpreter, the installed
library)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "rredcot_in_trl.py"


def test_the_example_trains_with_rredcot_credit(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE)], capture_output=True, text=True, cwd=tmp_path, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    traces = [int(n) for n in re.findall(r"credit assigned to (\d+) traces", proc.stdout)]
    assert len(traces) == 2 and all(n > 0 for n in traces), proc.stdout[-2000:]


def test_the_marked_lines_are_the_change() -> None:
    """The lines marked ``# RREDCoT`` are the import, the trainer and its ``credit=``: nothing else
    of a GRPO script changes (docs/library.md shows them)."""
    code = EXAMPLE.read_text().split('"""', 2)[2]  # after the module docstring
    marked = [line.strip() for line in code.splitlines() if "# RREDCoT" in line]
    assert marked == [
        "from rredcot import CreditConfig, RREDCoTTrainer  # RREDCoT (was: from trl import GRPOTrainer)",
        "trainer = RREDCoTTrainer(  # RREDCoT (was: GRPOTrainer)",
        'credit=CreditConfig(method="rredcot"),  # RREDCoT: the credit method and its settings',
    ]


SMOLLM2_EXAMPLE = EXAMPLE.with_name("rredcot_smollm2_math.py")


def test_the_real_model_example_trains_two_steps(smollm2: Path, tmp_path: Path) -> None:
    """examples/rredcot_smollm2_math.py as a user runs it, on SmolLM2-135M-Instruct (the checkpoint
    converted from the installed package) and MATH problems: two steps, each logging its reward and
    the traces its credit was assigned to, under the loss it states."""
    proc = subprocess.run(
        [sys.executable, str(SMOLLM2_EXAMPLE), "--model", str(smollm2), "--steps", "2"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    steps = re.findall(r"step (\d+): reward ([0-9.]+), credit assigned to (\d+) traces", proc.stdout)
    assert [s for s, _, _ in steps] == ["1", "2"], proc.stdout[-2000:]
    assert 'loss_type="grpo"' in SMOLLM2_EXAMPLE.read_text()
