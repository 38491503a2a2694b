"""The credit-fidelity study: its metrics on credit whose answer is known, the claim it decides, and
one small run of ``rredcot study-fidelity`` on a tiny model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import polars as pl
import pytest
import torch
import yaml
from synthetic_setup import synthetic_setup

from rredcot import credit_methods
from rredcot.adapter.prime import causal_log_probs
from rredcot.infra.io import write_jsonl
from rredcot.method.assign import CreditAssigner, TraceCredit, paid_credit
from rredcot.method.registry import TraceInput
from rredcot.method.settings import CreditConfig
from rredcot.settings.config import credit_config, load_config
from rredcot.studies import fidelity, fidelity_prime, traces
from rredcot.studies.claims import CORRELATION_DIFFERENCE_THRESHOLD, fidelity_claim

ROOT = Path(__file__).resolve().parents[1]


def _trace(problem: str, truth: list[float], lengths: list[int], correct: bool, culprit: int | None, **paid):
    return {
        "problem_id": problem,
        "correct": correct,
        "truth": truth,
        "lengths": lengths,
        "culprit": culprit,
        "paid": paid,
    }


def _traces() -> list[dict]:
    """Eight problems, a right and a wrong trace each, four segments of unequal truth."""
    out = []
    for p in range(8):
        right = [0.1 + 0.05 * p, 0.3, 0.0, 0.02]
        wrong = [0.05, -0.6 - 0.01 * p, 0.0, -0.1]
        lengths = [5 + p, 8, 6, 12]
        for truth, correct, culprit in ((right, True, None), (wrong, False, 1)):
            out.append(
                _trace(
                    f"p{p}",
                    truth,
                    lengths,
                    correct,
                    culprit,
                    same=list(truth),
                    reversed=[-t for t in truth],
                    uniform=[(1.0 if correct else -1.0) * n for n in lengths],
                )
            )
    return out


def test_a_method_equal_to_the_exact_values_ranks_perfectly_and_a_reversed_one_backwards() -> None:
    rows, draws = fidelity.score(_traces(), ["same", "reversed", "uniform"], draws=200, seed=0)
    same, backwards = rows["same"], rows["reversed"]
    assert same["rho_pooled"] == pytest.approx(1.0) and same["rho_trace"] == pytest.approx(1.0)
    assert backwards["rho_pooled"] == pytest.approx(-1.0) and backwards["rho_trace"] == pytest.approx(-1.0)
    assert same["rho_pooled_low"] == pytest.approx(1.0) and backwards["rho_pooled_high"] == pytest.approx(
        -1.0
    )
    assert same["culprit_hit"] == 1.0 and backwards["culprit_hit"] == 0.0
    assert same["sign_agreement"] == 1.0 and backwards["sign_agreement"] == 0.0
    assert same["traces"] == 16 and same["problems"] == 8 and same["segments"] == 64
    assert same["traces_ranked"] == 16 and same["wrong_located"] == 8
    # Every method is read on the same draws: the paired difference of two identical methods is 0.
    assert (draws["same"]["rho_pooled"] - draws["same"]["rho_pooled"] == 0).all()
    u = rows["uniform"]
    assert u["rho_pooled_low"] <= u["rho_pooled"] <= u["rho_pooled_high"]
    assert u["sign_agreement"] == 0.0  # an even spread pays no segment more than its share


def test_uniform_credit_pays_each_segment_in_proportion_to_its_length() -> None:
    items = [TraceInput([1, 2], list(range(10, 30)), -1.0, [("", "4")])]
    (credit,) = CreditAssigner(None, CreditConfig(method="uniform")).assign(None, items)
    bounds = [0, 3, 11, 20]
    assert fidelity.segment_sums(paid_credit(credit, -1.0), bounds) == pytest.approx([-3.0, -8.0, -9.0])
    # A method that gives each token its own advantage is summed as it is, whatever A is.
    own = TraceCredit(torch.ones(4), advantages=torch.tensor([0.5, -1.0, 2.0, 0.0]))
    assert fidelity.segment_sums(paid_credit(own, -1.0), [0, 2, 4]) == pytest.approx([-0.5, 2.0])


def test_culprit_hit_counts_the_most_blamed_segment_and_shares_ties() -> None:
    truth, lengths = [0.0, -0.8, 0.0], [4, 4, 4]
    assert fidelity.trace_metrics([-1.0, -5.0, -1.0], truth, lengths, False, 1)["hit"] == 1.0
    assert fidelity.trace_metrics([-5.0, -1.0, -1.0], truth, lengths, False, 1)["hit"] == 0.0
    assert fidelity.trace_metrics([-4.0, -4.0, -1.0], truth, lengths, False, 1)["hit"] == 0.5
    assert math.isnan(fidelity.trace_metrics([-1.0, -5.0, -1.0], truth, lengths, False, None)["hit"])
    assert math.isnan(fidelity.trace_metrics([-1.0, -5.0, -1.0], truth, lengths, True, 1)["hit"])
    assert math.isnan(fidelity.trace_metrics([-1.0, -5.0], [0.0, -0.8], [4, 4], False, 1)["rho"])
    located = [
        {"correct": False, "culprit": 1, "truth": truth},
        {"correct": False, "culprit": 0, "truth": [1, 2]},
    ]
    assert fidelity.chance_hit(located) == pytest.approx((1 / 3 + 1 / 2) / 2)


def test_sign_agreement_reads_credit_against_the_even_share() -> None:
    lengths, truth = [2, 2, 4], [0.6, 0.0, 0.2]  # per token: above, below, below the even share
    hits = fidelity.trace_metrics([3.0, 1.0, 3.5], truth, lengths, True, None)  # above, below, below
    assert (hits["agree"], hits["signed"]) == (3.0, 3.0)
    misses = fidelity.trace_metrics([1.0, 3.0, 3.5], truth, lengths, True, None)
    assert misses["agree"] == 1.0  # the third segment, below its share either way
    even = fidelity.trace_metrics([2.0, 2.0, 4.0], truth, lengths, True, None)
    assert (even["agree"], even["signed"]) == (0.0, 3.0)


def test_the_judge_segments_are_the_exit_points_then_the_answer() -> None:
    values = torch.tensor([0.5, 0.8, 1.0]).log()
    credit = TraceCredit(torch.ones(12), segment_starts=[0, 4, 8], cuts=[0, 4, 8], log_values=values)
    bounds, truth = fidelity.exact_segments(credit, 12, answered=True, outcome=0.0)
    assert bounds == [0, 4, 8, 12] and truth == pytest.approx([0.3, 0.2, -1.0])
    assert fidelity.exact_segments(credit, 12, answered=False, outcome=0.0) is None  # 3 starts, 2 changes
    assert (
        fidelity.culprit_segment(["ab"] * 12, 9, bounds) == 1
        and fidelity.culprit_segment([], None, bounds) is None
    )


def test_equal_cost_is_the_nearest_budget_on_a_log_scale() -> None:
    seconds = {"rredcot": 0.01, "mc@1": 0.03, "mc@2": 0.05, "mc@4": 0.1, "uniform": 0.0}
    assert fidelity.nearest_budget(seconds, "rredcot", "mc") == "mc@1"
    # 0.072 s: nearer 0.05 in seconds, nearer 0.1 in ratio (log scale)
    assert fidelity.nearest_budget({**seconds, "rredcot": 0.072}, "rredcot", "mc") == "mc@4"
    assert fidelity.nearest_budget({"rredcot": 0.01}, "rredcot", "mc") is None


def _comparison(diff: float, low: float, high: float) -> dict:
    return {
        "comparison": {
            "method": "rredcot",
            "reference": "mc@1",
            "samples": 1,
            "cost_ratio": 3.0,
            "rho_pooled": 0.5 + diff,
            "reference_rho_pooled": 0.5,
            # The pooled difference points the other way: the verdict must follow the within-trace one.
            "rho_pooled_diff": -diff,
            "rho_pooled_diff_low": -high,
            "rho_pooled_diff_high": -low,
            "rho_trace_diff": diff,
            "rho_trace_diff_low": low,
            "rho_trace_diff_high": high,
        },
        "rows": [{"key": "rredcot", "traces": 96, "problems": 96}],
        "device": "CPU",
    }


def test_the_claim_follows_the_paired_difference() -> None:
    line = CORRELATION_DIFFERENCE_THRESHOLD
    assert fidelity_claim(_comparison(0.2, line + 0.01, 0.3), "f.json").verdict == "supported"
    assert fidelity_claim(_comparison(-0.2, -0.3, -line - 0.01), "f.json").verdict == "contradicted"
    assert fidelity_claim(_comparison(0.03, -0.01, 0.08), "f.json").verdict == "inconclusive"
    assert fidelity_claim(_comparison(0.0, -line / 2, line / 2), "f.json").verdict == "too small to matter"
    missing = fidelity_claim({"comparison": None, "skipped": {"mc": "needs rollouts"}}, "f.json")
    assert missing.verdict == "inconclusive" and "needs rollouts" in missing.note


def test_the_paired_difference_is_computed_on_the_same_draws() -> None:
    data = _traces()
    rows, draws = fidelity.score(data, ["same", "uniform"], draws=200, seed=1)
    seconds = {"same": 0.01, "uniform": 0.02}
    rows = {k: r | {"seconds_per_trace": seconds[k], "samples": 1} for k, r in rows.items()}
    rows["mc@1"], draws["mc@1"] = rows.pop("uniform"), draws.pop("uniform")
    c = fidelity.compare({"rredcot": rows["same"], **rows}, {"rredcot": draws["same"], **draws})
    assert c["reference"] == "mc@1" and c["cost_ratio"] == pytest.approx(2.0)
    assert c["rho_pooled_diff"] == pytest.approx(1.0 - rows["mc@1"]["rho_pooled"])
    assert c["rho_pooled_diff_low"] <= c["rho_pooled_diff"] <= c["rho_pooled_diff_high"]


def test_every_registered_method_is_a_point_and_mc_one_per_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load_config(ROOT / "config" / "config.yaml")
    points, skipped = fidelity.method_points(cfg, credit_methods(), [1, 4])
    keys = [p.key for p in points]
    # Every need is supplied, PRIME's reward model included (trained online over the traces).
    assert "mc@1" in keys and "mc@4" in keys and "mc" not in keys and not skipped
    assert {p.method for p in points} == set(credit_methods())
    assert {p.config.mc.samples for p in points if p.method == "mc"} == {1, 4}
    monkeypatch.setattr(fidelity, "SUPPLIED", fidelity.SUPPLIED - {"rollouts"})
    points, skipped = fidelity.method_points(cfg, credit_methods(), [1, 4])
    assert "mc" in skipped and "rollouts" in skipped["mc"] and not any(p.method == "mc" for p in points)


# ------------------------------------------------------------------------------ one small run
@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fidelity")
    _, tok, model, splits = synthetic_setup()
    model.save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    write_jsonl(root / "test.jsonl", splits["test"])
    override = {
        "results_dir": str(root / "results"),
        "credit": {"segmentation": {"n_segments": 3}},
        "studies": {"n_traces": 6, "max_new_tokens": 24, "fidelity": {"traces": 6, "mc_samples": [1, 2]}},
        # PRIME's groups of 4, its reward model updated after every two: three updates over six traces.
        "rl": {"num_generations": 4, "prompts_per_step": 2},
    }
    (root / "override.yaml").write_text(yaml.safe_dump(override))
    cfg = ["--config", str(ROOT / "config" / "config.yaml"), str(root / "override.yaml")]
    model, data, trace_file = str(root / "model"), str(root / "test.jsonl"), str(root / "traces.jsonl")
    with pytest.MonkeyPatch.context() as env:
        env.delenv("MLFLOW_TRACKING_URI", raising=False)
        env.setenv("RREDCOT_INVOCATION", "fidelity-test")
        traces.main([*cfg, "--set", "analysis", "--model", model, "--data", data, "--out", trace_file])
        out = ["--json", str(root / "f.json"), "--csv", str(root / "f.csv"), "--figure", str(root / "f.png")]
        fidelity.main([*cfg, "--model", model, "--traces", trace_file, "--data", data, *out])
    return root


def test_the_study_scores_every_method_and_writes_its_outputs(run: Path) -> None:
    summary = json.loads((run / "f.json").read_text())
    table = pl.read_csv(run / "f.csv")
    expected = [m for m in credit_methods() if m != "mc"]
    keys = table["key"].to_list()
    assert set(keys) == {*expected, "mc@1", "mc@2"} and not summary["skipped"]
    prime = summary["costs"]["prime"]
    assert prime["updates"] == 3 and prime["completions"] == 6 * 4 and 0 < prime["seconds"]
    assert summary["traces"] + len(summary["dropped"]) == 6
    assert (table["seconds"] >= 0).all() and table.filter(pl.col("key") == "mc@2")["rollouts_per_trace"][
        0
    ] > 0
    for t in summary["segments"]:
        assert set(t["paid"]) == set(keys) and len(t["truth"]) == len(t["lengths"]) == len(t["bounds"]) - 1
        # Uniform credit pays A per token: each segment its length, signed.
        sign = 1.0 if t["correct"] else -1.0
        assert t["paid"]["uniform"] == pytest.approx([sign * n for n in t["lengths"]])
    assert (run / "f.png").stat().st_size > 1000 and (run / "f.pdf").exists()
    assert summary["comparison"]["method"] == "rredcot" and summary["comparison"]["reference"] in {
        "mc@1",
        "mc@2",
    }


# ------------------------------------------------------------------------------ PRIME, online
def test_left_padded_log_probs_are_each_rows_own() -> None:
    """The PRM's log-probabilities of a left-padded batch equal each row's scored alone (positions
    count from the row's first token), and carry a gradient."""
    _, tok, model, _ = synthetic_setup()
    model.eval()
    rows = [([5, 6, 7, 8, 9], [10, 11, 12]), ([5, 6], [13, 14, 15, 16])]
    items = [TraceInput(p, c, 0.0, []) for p, c in rows]
    ids, attention, completion = fidelity_prime.batch_tensors(items, pad_id=0)
    assert completion.tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    batch = causal_log_probs(model, ids, attention, completion.shape[1])
    assert batch.requires_grad
    for i, (p, c) in enumerate(rows):
        alone = torch.tensor([p + c])
        want = causal_log_probs(model, alone, torch.ones_like(alone), len(c))[0]
        torch.testing.assert_close(batch[i, : len(c)], want, rtol=1e-5, atol=1e-5)


def test_prime_learns_online_and_pays_the_outcome_alone_before_its_first_update() -> None:
    """Before its first update the PRM equals its reference: each trace of the first batch is paid its
    outcome's leave-one-out advantage on every token alike. After it the PRM has moved, and a trace of
    a later batch is paid unevenly; the groups' first traces are the ones returned."""
    cfg, tok, model, _ = synthetic_setup()
    model.eval()
    config = credit_config(cfg, "rredcot", "prime")
    prompt = CreditAssigner(tok, config).encode("Problem: Start at 3, add 4. Work mod 10.\n<think>\n")
    g = torch.Generator().manual_seed(0)
    groups = []
    for j in range(4):
        group = []
        for k in range(3):
            completion = torch.randint(5, 40, (6 + (j + k) % 3,), generator=g).tolist()
            group.append(TraceInput(list(prompt), completion, 0.0, [], outcome=float((j + k) % 2)))
        groups.append(group)
    before = [p.detach().clone() for p in model.parameters()]
    credits, cost = fidelity_prime.online_prime(config, model, tok, groups, 2, 1.0, 1e-4)
    assert len(credits) == 4 and cost["updates"] == 2 and cost["completions"] == 12
    for a, b in zip(before, model.parameters(), strict=True):
        assert torch.equal(a, b)  # the policy (PRIME's reference) is never trained
    first = credits[0].advantages
    assert torch.allclose(first, first[0].expand_as(first))  # the outcome alone, on every token
    late = credits[2].advantages
    assert not torch.allclose(late, late[0].expand_as(late))  # the trained PRM's process rewards
