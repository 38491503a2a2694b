"""The tools compute σ as training does: `rredcot bench` and `rredcot gpu-check` take their credit
settings from the config, and bench's σ on its random batch is CreditAssigner's on the same traces."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml
from numerics import assert_same_credit, log_prob_sum_tol, model_terms

from rredcot.method.assign import CreditAssigner
from rredcot.settings.config import credit_config, load_config
from rredcot.tools import bench, credit_batches

ROOT = Path(__file__).resolve().parents[1]
# Settings away from the defaults and from what the tools once hard-coded (mix 0.5, segments of at
# least 4 tokens, log-space rewards): a tool that ignores the config computes another σ.
CREDIT = {
    "mix": 0.8,
    "value_space": "linear",
    "answer_baseline": "reference",  # no greedy decoding: keeps the test short
    "segmentation": {"min_segment_tokens": 2, "homogenize": False},
}
EXITS = 12  # short segments: how long a segment must be matters


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    override = tmp_path_factory.mktemp("sigma") / "credit.yaml"
    override.write_text(yaml.safe_dump({"credit": CREDIT}))
    return [str(ROOT / "config" / "config.yaml"), str(override)]


def _expected(paths: list[str]):  # noqa: ANN202
    """The RREDCoT arm's credit as training builds it, with the batch's number of exit points."""
    credit = credit_config(load_config(paths), "rredcot")
    credit.segmentation = replace(credit.segmentation, n_segments=EXITS - 1, tokens_per_segment=0)
    return credit


@pytest.mark.numerics
def test_bench_sigma_is_credit_assigners(config: list[str]) -> None:
    args = bench.parser().parse_args(
        ["--config", *config, "--hidden", "32", "--layers", "2", "--heads", "2", "--vocab", "160"]
        + ["--traces", "4", "--prompt", "8", "--length", "80", "--exits", str(EXITS), "--suffix", "14"]
    )
    batch = bench.make_batch(args, load_config(args.config))
    expected = _expected(config)
    assert batch.credit.mix == 0.8 and batch.credit.value_space == "linear"
    with torch.inference_mode():
        reference = CreditAssigner(batch.tok, expected).assign(batch.model, batch.items)
    assert {t.advantage for t in batch.items} == {1.0, -1.0}
    assert all(len(c.cuts) == EXITS for c in reference)  # the batch's exit points
    single, passes = bench.sigma(batch, "single_pass")
    naive, _ = bench.sigma(batch, "naive")
    assert passes["scoring"] > 0
    # The naive scorer sums the same log-probabilities through other kernels: n = the model's
    # accumulations over sequences of at most prompt + length + suffix tokens, at most the suffix's
    # 14 tokens scored per sum.
    score_tol = log_prob_sum_tol(model_terms(batch.model, 8 + 80 + 14), 14)
    for ref, one, other, item in zip(reference, single, naive, batch.items, strict=True):
        assert one.segment_starts == ref.segment_starts and one.cuts == ref.cuts
        assert torch.equal(one.multiplier, ref.multiplier)
        assert_same_credit(other, ref, item.advantage, batch.credit.mix, score_tol)
    # Credit moved (a trace whose rewards all have its advantage's opposite sign keeps uniform σ).
    assert sum(not torch.allclose(c.multiplier, torch.ones_like(c.multiplier)) for c in reference) >= 2


def test_gpu_check_credit_is_the_recipes(config: list[str]) -> None:
    """gpu-check times the recipe's own credit: only the segmentation target is the batch's."""
    _, credit, _ = credit_batches.recipe_credit(config[-1], EXITS, tiny=False)
    expected = _expected(config)
    expected.view_every = 0  # no pictures in a timing run; never read by σ
    assert credit == expected
