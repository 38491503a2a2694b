"""Study traces, Monte Carlo values at exit points, and Figures 3 and 7 (rredcot.studies)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from tiny_models import TINY_SETTINGS

from rredcot.data.synthetic import TaskConfig, generate_splits
from rredcot.infra.io import read_jsonl, write_jsonl
from rredcot.lm.generation import Completion, GumbelSampling, HFGenerator, sample_seed
from rredcot.lm.modeling import build_scratch_model, train_tokenizer
from rredcot.lm.rollouts import answer_token, rollout_record
from rredcot.studies import figures_mc, mc, traces
from rredcot.studies.figures_mc import bootstrap_sd, lost_at, truncation_table, variance_table

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "config" / "config.yaml"
TINY = TINY_SETTINGS


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A tiny random Qwen2 with a tokenizer trained on synthetic traces, test problems, a config."""
    root = tmp_path_factory.mktemp("studies")
    splits = generate_splits(TaskConfig(n_sft=300, n_rl=10, n_test=24, seed=5))
    corpus = [f"Problem: {r['problem']}\n<think>\n{r['completion']}" for r in splits["sft"]]
    tok = train_tokenizer(corpus, 300)
    model = build_scratch_model(tok, TINY, seed=0)
    model.save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    write_jsonl(root / "test.jsonl", splits["test"])
    override = root / "override.yaml"
    override.write_text(
        yaml.safe_dump({"results_dir": str(root / "results"), "credit": {"segmentation": {"n_segments": 3}}})
    )
    return {"root": root, "tok": tok, "model": model, "config": [str(CONFIG), str(override)]}


@pytest.fixture
def local_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """MLflow runs go to the test's results_dir, never to a store named in the environment."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("RREDCOT_INVOCATION", "studies-test")


# ------------------------------------------------------------------------------------------ units
def test_sample_problems_is_stratified_and_deterministic() -> None:
    rows = [{"id": f"p{i}", "level": i % 4, "source": "s"} for i in range(40)]
    a = traces.sample_problems(rows, 8, seed=1)
    assert [r["id"] for r in a] == [r["id"] for r in traces.sample_problems(rows, 8, seed=1)]
    assert sorted(r["level"] for r in a) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert {r["id"] for r in a} != {r["id"] for r in traces.sample_problems(rows, 8, seed=2)}
    # Beyond the rows every problem is drawn again, in the same order, and each draw of a problem
    # samples its own trace.
    more = traces.sample_problems(rows, 100, seed=1)
    first = traces.sample_problems(rows, 40, seed=1)
    assert len(more) == 100 and more[:40] == first and more[40:80] == first and more[80:] == first[:20]
    seeds = traces.trace_seeds(more, seed=1)
    assert seeds[:40] == [sample_seed(1, "trace", r["id"]) for r in first]  # a first draw's seed as before
    assert len(set(seeds)) == 100
    assert traces.sample_problems([], 5, seed=1) == []


def test_sampler_rows_do_not_depend_on_their_batch(setup: dict) -> None:
    tok, model = setup["tok"], setup["model"]
    prefix = tok("Problem: Start at 3, add 4. Work mod 10.\n<think>\n")["input_ids"]
    seeds = [sample_seed(0, "t", j) for j in range(4)]
    kw = {"temperature": 1.0, "top_p": 0.95, "max_new_tokens": 12}
    alone = HFGenerator(model, tok, batch_size=4, progress=False).sample([prefix] * 4, seeds, **kw)
    mixed = HFGenerator(model, tok, batch_size=3, progress=False).sample(
        [prefix[:5], *[prefix] * 4], [7, *seeds], **kw
    )[1:]
    assert [r.token_ids for r in alone] == [r.token_ids for r in mixed]
    assert len({tuple(r.token_ids) for r in alone}) > 1  # different seeds, different samples
    greedy = HFGenerator(model, tok, batch_size=2, progress=False).sample(
        [prefix] * 2, [1, 2], **{**kw, "temperature": 0}
    )
    assert greedy[0].token_ids == greedy[1].token_ids


def test_gumbel_trick_samples_the_tempered_top_p_distribution() -> None:
    logits = torch.tensor([2.0, 1.0, 0.5, -1.0, -3.0])
    n, temperature = 4000, 0.8
    probs = (logits / temperature).softmax(-1)
    sampler = GumbelSampling(range(n), temperature, 1.0, torch.device("cpu"))
    picks = sampler(None, logits.expand(n, -1).clone()).argmax(-1)
    freq = torch.bincount(picks, minlength=5) / n
    assert torch.allclose(freq, probs, atol=0.03)
    # top-p keeps the smallest head reaching p: here the first two tokens (0.68 + 0.20 >= 0.85).
    picks = GumbelSampling(range(n), temperature, 0.85, torch.device("cpu"))(
        None, logits.expand(n, -1).clone()
    )
    freq = torch.bincount(picks.argmax(-1), minlength=5) / n
    assert freq[2:].sum() == 0 and torch.allclose(freq[:2], probs[:2] / probs[:2].sum(), atol=0.03)


TOKENS = ["So", ",", " 3", ".\n", "</think>", "\n", "3", " \\boxed{", "1", "2", "}", "<eos>"]


def _decode(ids: list[int]) -> str:
    return "".join(TOKENS[i] for i in ids if TOKENS[i] != "<eos>")


def test_answer_token_marks_where_the_final_answer_is_complete() -> None:
    ids = list(range(len(TOKENS)))
    assert answer_token("First, 1 + 2 = 3.\n", ids, _decode, "</think>\n") == 11  # after "}"
    assert answer_token("", ids[:10], _decode, "</think>\n") is None  # box never closed
    # A box in the thinking part does not count once the model exits.
    assert answer_token("\\boxed{7}", ids[:7], _decode, "</think>\n") is None
    # Without an exit the whole text counts, so an answer in the prefix is complete at once.
    assert answer_token("\\boxed{7}", ids[:3], _decode, "</think>\n") == 0
    rec = rollout_record("", Completion(ids, _decode(ids), False), "12", _decode, "</think>\n")
    assert rec == {"n_tokens": 12, "truncated": False, "answer": "12", "correct": True, "answer_token": 11}


def test_truncation_thresholds_on_hand_made_rollouts() -> None:
    rollouts = [
        {"answer_token": 5, "correct": True, "n_tokens": 6},
        {"answer_token": 20, "correct": True, "n_tokens": 21},
        {"answer_token": 20, "correct": False, "n_tokens": 21},
        {"answer_token": None, "correct": False, "n_tokens": 30},  # no answer within B = 30
    ]
    assert [lost_at(r, 5) for r in rollouts] == [False, True, True, True]
    assert [lost_at(r, 4) for r in rollouts] == [True, True, True, True]
    assert [lost_at(r, 30) for r in rollouts] == [False, False, False, True]
    records = [{"trace_id": "a", "rollouts": rollouts}]
    table = truncation_table(records, {"a": "g"}, [4, 5, 20, 30]).filter(group="g").sort("truncation")
    assert table["lost"].to_list() == [1.0, 0.75, 0.25, 0.25]
    assert table["lost_correct"].to_list() == [0.5, 0.25, 0.0, 0.0]  # correct if continued
    assert table["lost_other"].to_list() == [0.5, 0.5, 0.25, 0.25]
    assert table["tokens_per_point"].to_list() == [16, 20, 66, 78]  # sum of min(n_tokens, T)


def test_bootstrap_sd_shrinks_as_samples_grow() -> None:
    rng = np.random.default_rng(0)
    p = np.array([0.5, 0.3, 0.8, 0.6])
    correct = (rng.random((4, 20)) < p[:, None]).astype(float)
    sizes = list(range(1, 21))
    value_sd, norm_sd = bootstrap_sd(correct, sizes, 2000, np.random.default_rng(1))
    mean_sd = value_sd.mean(axis=1)
    assert np.all(np.diff(mean_sd) < 0.01) and mean_sd[-1] < 0.5 * mean_sd[0]
    # The bootstrap sd of a mean of m draws is about sqrt(p̂(1 - p̂) / m).
    p_hat = correct.mean(axis=1)
    assert np.allclose(value_sd[3], np.sqrt(p_hat * (1 - p_hat) / 4), atol=0.03)
    assert np.isnan(norm_sd[:, 0]).all() and norm_sd[-1, 1:].max() < norm_sd[0, 1:].min()
    records = [
        {"trace_id": "t", "exit_index": e, "rollouts": [{"correct": bool(c)} for c in row]}
        for e, row in enumerate(correct)
    ]
    a, b = variance_table(records, 200, seed=3), variance_table(records, 200, seed=3)
    assert a.equals(b) and a.height == 20 * 4
    assert (
        a.filter(samples=20, exit_points=4)["value_sd"][0] < a.filter(samples=2, exit_points=4)["value_sd"][0]
    )


# ------------------------------------------------------------------------------------- end to end
def test_traces_mc_and_figures_pipeline(setup: dict, local_store: None, tmp_path: Path) -> None:
    m = 3
    # The studies' settings come from the config alone (rredcot.settings.reads).
    studies = {"n_traces": 4, "seed": 1, "max_new_tokens": 24, "mc_samples": m, "mc_max_new_tokens": 16}
    (tmp_path / "studies.yaml").write_text(yaml.safe_dump({"studies": studies | {"bootstrap": 50}}))
    cfg, model = [*setup["config"], str(tmp_path / "studies.yaml")], str(setup["root"] / "model")
    trace_file = tmp_path / "traces.jsonl"
    traces.main(
        ["--config", *cfg, "--set", "analysis", "--model", model, "--data", str(setup["root"] / "test.jsonl")]
        + ["--out", str(trace_file)]
    )
    rows = read_jsonl(trace_file)
    assert len(rows) == 4 and len({r["level"] for r in rows}) == 4  # one per level
    for r in rows:
        n = len(r["completion_ids"])
        assert len(r["tokens"]) == len(r["sigma"]) == len(r["entropies"]) == n > 0
        assert len(r["log_values"]) == len(r["cuts"]) == len(r["thought_nll"]) == len(r["answer_nll"])
        assert all(0 <= c <= n for c in r["cuts"]) and r["cuts"] == sorted(set(r["cuts"]))
        assert math.isclose(sum(r["sigma"]), 1.0, abs_tol=1e-9) and min(r["sigma"]) >= 0
        assert len(r["segment_rewards"]) == len(r["segment_starts"])
        assert r["advantage"] == (1.0 if r["correct"] else -1.0)

    outs = [tmp_path / "mc1.jsonl", tmp_path / "mc2.jsonl"]
    for out in outs:
        mc.main(
            ["--config", *cfg, "--model", model, "--traces", str(trace_file), "--out", str(out)]
            + ["--batch-size", "8", "--stats", str(out.with_suffix(".stats.json"))]
        )
    assert outs[0].read_bytes() == outs[1].read_bytes()  # deterministic in the seed
    records = read_jsonl(outs[0])
    assert len(records) == sum(len(r["cuts"]) for r in rows)
    for rec in records:
        assert len(rec["rollouts"]) == m
        assert rec["mc_value"] == sum(x["correct"] for x in rec["rollouts"]) / m
        assert all(1 <= x["n_tokens"] <= 16 for x in rec["rollouts"])

    out_dir = tmp_path / "figures"
    figures_mc.main(
        ["--config", *cfg, "--traces", str(trace_file), "--mc", str(outs[0]), "--out-dir", str(out_dir)]
        + ["--mc-stats", str(outs[0].with_suffix(".stats.json"))]
    )
    for stem in ("fig3_truncation", "fig7_mc_variance"):
        assert (out_dir / f"{stem}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (out_dir / f"{stem}.pdf").read_bytes()[:5] == b"%PDF-"
        assert (out_dir / f"{stem}.csv").stat().st_size > 0
