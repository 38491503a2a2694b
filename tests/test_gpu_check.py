"""`rredcot gpu-check` runs its every section on a CPU in its tiny form (the GPU form is the same code)."""

from __future__ import annotations

import json

import pytest

from rredcot.stages.gpu_check import main


@pytest.mark.slow
def test_gpu_check_tiny_on_cpu(tmp_path):
    out = tmp_path / "gpu.json"
    main(["--device", "cpu", "--tiny", "--out", str(out)])
    report = json.loads(out.read_text())
    (entry,) = report["models"].values()
    assert [row["tokens"] for row in entry["scoring"]] == [256, 512]
    for row in entry["scoring"]:
        assert row["single_pass_s"] > 0 and row["ratio_to_forward"] > 0 and row["sdpa"]
    assert 0 <= entry["sigma_bf16_vs_fp32"]["max_abs_diff_sigma_x_len"] < 1.0
    assert [row["tokens"] for row in entry["micro_batch"]] == [256, 512]
    steps = report["trainer_steps"]
    assert len(steps["step_s"]) == 3 and len(steps["credit_s"]) == 3
    assert steps["master_dtype"] == "torch.float32"


def test_gpu_check_refuses_without_cuda():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(SystemExit, match="no CUDA device"):
        main(["--out", "/dev/null"])
