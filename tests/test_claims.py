"""claims.csv: each claim of the paper checked against the run's measurements (rredcot.studies:
``claims``, ``claims_table``, ``power``, ``claims_markdown``; verdicts and intervals in
rredcot.infra.stats)."""

from __future__ import annotations

import dataclasses
import math

import polars as pl
import pytest
from scipy import stats

from rredcot.infra import stats as S
from rredcot.settings.config import load_config
from rredcot.studies import claims as C
from rredcot.studies import claims_markdown as MD
from rredcot.studies import claims_table as CT
from rredcot.studies import methods_table as MT
from rredcot.studies import power as PW

SOURCES = {k: f"{k}.csv" for k in ("paired", "cost", "truncation", "attribution", "prm", "variance")} | {
    "localisation": "localisation.json"
}


def test_verdicts_judge_the_interval_by_size():
    t = C.ACCURACY_THRESHOLD
    assert S.verdict_by_size(t + 0.001, 0.2, t) == "supported"
    assert S.verdict_by_size(0.001, 0.2, t) == "inconclusive"  # above 0, but maybe below what matters
    assert S.verdict_by_size(-0.2, -t - 0.001, t) == "contradicted"
    assert S.verdict_by_size(-t + 0.001, t - 0.001, t) == "too small to matter"
    assert S.verdict_by_size(-0.1, 0.1, t) == "inconclusive"
    assert S.verdict_by_size(None, 0.1, t) == "inconclusive"
    assert S.verdict_by_size(0.75, 0.9, 0.03, line=0.7) == "supported"


def test_verdicts_follow_the_interval():
    assert S.verdict_above(0.01, 0.2) == "supported"
    assert S.verdict_above(-0.2, -0.01) == "contradicted"
    assert S.verdict_above(-0.1, 0.1) == "inconclusive"
    assert S.verdict_above(None, 0.3) == "inconclusive"
    assert S.verdict_above(0.71, 0.9, line=0.7) == "supported"


def test_wilson_interval_matches_its_formula_and_stays_in_0_1():
    low, high = S.wilson_interval(0.0, 50)
    assert low == pytest.approx(0.0, abs=1e-12) and 0.0 < high < 0.1
    low, high = S.wilson_interval(0.5, 100)
    assert low == pytest.approx(0.4038, abs=1e-3) and high == pytest.approx(0.5962, abs=1e-3)


def test_fisher_interval_covers_the_spearman_correlation_of_samples():
    # Monte Carlo: the interval of a sample's Spearman rho covers the population's about 95% of the time.
    import numpy as np

    rng = np.random.default_rng(0)
    rho_true, covered, trials = 0.5, 0, 400
    cov = [[1, rho_true], [rho_true, 1]]
    big = rng.multivariate_normal([0, 0], cov, size=200_000)
    target = stats.spearmanr(big[:, 0], big[:, 1]).statistic
    for _ in range(trials):
        xy = rng.multivariate_normal([0, 0], cov, size=40)
        low, high = S.fisher_interval(stats.spearmanr(xy[:, 0], xy[:, 1]).statistic, 40)
        covered += low <= target <= high
    assert 0.9 <= covered / trials <= 0.99
    assert all(math.isnan(x) for x in S.fisher_interval(0.3, 3))


def _paired(rows):
    cols = ["arm", "reference", "metric", "seeds", "problems", "diff", "diff_low", "diff_high"]
    cols += ["steps_to_reference", "steps_low", "steps_high", "area", "area_low", "area_high"]
    cols += ["seed_sd", "problem_sd"]
    return pl.DataFrame([dict(zip(cols, r, strict=True)) for r in rows])


def _intervals(table: pl.DataFrame, design_effect: float = 1.0) -> pl.DataFrame:
    """Each correlation's 95% interval as its figure writes it (``spearman_low``, ``spearman_high``):
    here the Fisher interval of ``n / design_effect`` independent pairs."""
    bounds = [
        S.fisher_interval(r, int((n - 3) / design_effect) + 3)
        for r, n in zip(table["spearman"], table["n"], strict=True)
    ]
    return table.with_columns(
        pl.Series("spearman_low", [b[0] for b in bounds]), pl.Series("spearman_high", [b[1] for b in bounds])
    )


@pytest.fixture
def inputs():
    # A run with the Monte Carlo arm (the default leaves it to config/baselines.yaml).
    cfg = load_config("config/config.yaml", {"run_arms": ["grpo", "rredcot", "mc", "oracle", "exact"]})
    paired = _paired(
        [
            # arm, reference, metric, seeds, problems, diff [low, high], steps to reach [low, high],
            # area [low, high], sd over seeds, sd over problems
            ("RREDCoT", "GRPO", "sampled", 3, 100, 0.01, -0.02, 0.04, 30.0, 20.0, 45.0)
            + (0.02, 0.01, 0.03, 0.02, 0.2),
            ("MC", "GRPO", "sampled", 3, 100, 0.03, 0.01, 0.05, 20.0, 10.0, 30.0)
            + (0.01, 0.0, 0.02, 0.015, 0.2),
            ("Oracle", "GRPO", "sampled", 3, 100, 0.06, 0.03, 0.09, 15.0, 10.0, 20.0)
            + (0.03, 0.02, 0.04, 0.02, 0.2),
            ("Oracle", "GRPO", "greedy", 3, 100) + (0.0,) * 11,
            ("Exact values", "GRPO", "sampled", 3, 100, 0.04, 0.02, 0.06, 15.0, 10.0, 20.0)
            + (0.03, 0.02, 0.04, 0.02, 0.2),
            # RREDCoT against MC: behind by at most 0.004 over the run, final interval straddling -0.005.
            ("RREDCoT", "MC", "sampled", 3, 100, -0.02, -0.04, 0.0, 30.0, 20.0, 45.0)
            + (0.01, -0.004, 0.02, 0.02, 0.2),
        ]
    )
    cost = pl.DataFrame(
        [
            {"item": "GRPO", "kind": "train", "step_ratio_to_grpo": 1.0},
            {"item": "RREDCoT", "kind": "train", "step_ratio_to_grpo": 1.8},
            {"item": "MC", "kind": "train", "step_ratio_to_grpo": 9.0},
            {"item": "Oracle", "kind": "train", "step_ratio_to_grpo": 1.1},
        ]
    )
    # 200 rollouts from 10 exit points, 40 tokens long on average (800 tokens a point at B = 160):
    # half the mean length is T = 20.
    truncation = pl.DataFrame(
        [
            {
                "group": "all",
                "truncation": t,
                "points": 10,
                "rollouts": 200,
                "lost": lost,
                "lost_correct": lc,
                "tokens_per_point": 20 * min(t, 40),
            }
            for t, lost, lc in ((10, 0.9, 0.4), (20, 0.5, 0.2), (40, 0.2, 0.1), (80, 0.05, 0.0), (160, 0, 0))
        ]
    )
    attribution = _intervals(
        pl.DataFrame(
            [
                {"method_a": "rredcot", "method_b": "mc", "fraction": f, "n": n, "spearman": rho}
                for f, n, rho in ((0.2, 60, 0.7), (0.6, 150, 0.5), (1.0, 300, 0.4))
            ]
            + [{"method_a": "rredcot", "method_b": "loo", "fraction": 0.2, "n": 60, "spearman": -0.9}]
        )
    )
    prm = _intervals(
        pl.DataFrame(
            [
                {
                    "prm": "prm_score",
                    "given_answer": False,
                    "nll": "d_thought_nll",
                    "n": 200,
                    "spearman": -0.6,
                },
                {"prm": "prm_score", "given_answer": False, "nll": "d_answer_nll", "n": 200, "spearman": 0.1},
                {"prm": "prm_score", "given_answer": True, "nll": "d_answer_nll", "n": 200, "spearman": 0.9},
            ]
        )
    )
    variance = pl.DataFrame(
        [
            {"samples": m, "exit_points": k, "traces": 8, "value_sd": 0.3 / math.sqrt(m) + 0.01 * k}
            for m in (1, 2, 4, 8)
            for k in (1, 2, 3)
        ]
    )
    localisation = {"thinking": {"traces": 40, "top_blame_rate": 0.9, "chance": 0.2}}
    return cfg, paired, cost, truncation, attribution, prm, variance, localisation


COMPUTE = pl.DataFrame(
    [
        {
            "arm": "RREDCoT",
            "reference": "MC",
            "seeds": 3,
            "arm_seconds": 100.0,
            "reference_seconds": 300.0,
            "cost_share": 0.33,
            "equal_compute_diff": 0.03,
            "equal_compute_low": 0.01,
            "equal_compute_high": 0.05,
            "reach_share": 0.25,
            "reach_low": 0.2,
            "reach_high": float("inf"),
        }
    ]
)


def test_claims_table_reads_each_source_and_judges_it(inputs):
    rows = {c.claim: c for c in CT.claims_table(*inputs, SOURCES, COMPUTE)}
    assert list(rows) == [
        "rredcot_beats_grpo",
        "mc_beats_grpo",
        "sample_efficiency",
        "mc_sample_efficiency",
        "rredcot_matches_mc",
        "rredcot_matches_mc_over_the_run",
        "rredcot_matches_mc_at_equal_compute",
        "rredcot_tracks_mc",
        "truncated_mc_loses_rollouts",
        "mc_estimates_noisy",
        "prm_follows_thought_nll",
        "cost",
        "testbed_exact_beats_grpo",
        "testbed_oracle_beats_grpo",
        "testbed_localisation",
    ]
    verdicts = {k: c.verdict for k, c in rows.items()}
    assert verdicts == {
        "rredcot_beats_grpo": "inconclusive",  # [-0.02, 0.04] straddles the threshold
        "mc_beats_grpo": "supported",  # [0.01, 0.05]: beyond 0.005
        "sample_efficiency": "supported",  # RREDCoT leads by 0.02 [0.01, 0.03] over the run
        "mc_sample_efficiency": "inconclusive",  # MC leads by 0.01 [0.0, 0.02]: maybe less than 0.005
        "rredcot_matches_mc": "inconclusive",  # [-0.04, 0.0]: maybe behind by more than 0.005
        "rredcot_matches_mc_over_the_run": "supported",  # [-0.004, 0.02]: behind by less than 0.005
        "rredcot_matches_mc_at_equal_compute": "supported",  # [0.01, 0.05] at equal seconds
        "rredcot_tracks_mc": "supported",  # late 0.7 > overall 0.4, interval above 0.3
        "truncated_mc_loses_rollouts": "supported",  # 20% of 200 rollouts at T = 20 = L / 2
        "mc_estimates_noisy": "supported",  # M = 4: 0.15 + 0.03
        "prm_follows_thought_nll": "supported",  # |-0.6| vs |0.1|, intervals apart
        "cost": "within the paper's range",  # 1.8x, MC 9x = 5x RREDCoT
        "testbed_exact_beats_grpo": "supported",  # [0.02, 0.06]
        "testbed_oracle_beats_grpo": "supported",
        "testbed_localisation": "supported",  # 0.9 of 40, Wilson low > 0.7
    }
    assert "judged by size: inconclusive" in rows["rredcot_matches_mc_over_the_run"].note
    equal = rows["rredcot_matches_mc_at_equal_compute"]
    assert "0.330 of MC's seconds" in equal.measure and "0.25 [0.20, inf]" in equal.measure
    assert equal.source == "compute.csv" and "judged by size: supported" in equal.note
    assert rows["truncated_mc_loses_rollouts"].value == 0.2
    # The curve against the testbed's own rollout length: a quarter, half, three quarters, all of it.
    assert "0.25L (T = 10): 0.400" in rows["truncated_mc_loses_rollouts"].measure
    assert "1L (T = 40): 0.100" in rows["truncated_mc_loses_rollouts"].measure
    assert all(c.threshold for c in rows.values())
    assert rows["mc_estimates_noisy"].value == pytest.approx(0.3 / 2 + 0.03)
    assert rows["rredcot_tracks_mc"].value == 0.7
    assert rows["cost"].value == 1.8 and rows["prm_follows_thought_nll"].value == pytest.approx(0.5)
    assert all(c.source for c in rows.values())


def test_claims_turn_against_the_paper_when_the_numbers_do(inputs):
    cfg, paired, cost, truncation, attribution, prm, variance, localisation = inputs
    paired = paired.with_columns(
        pl.when(pl.col("arm") == "RREDCoT").then(-0.05).otherwise(pl.col("diff_high")).alias("diff_high"),
        pl.when(pl.col("arm") == "RREDCoT").then(-0.08).otherwise(pl.col("diff_low")).alias("diff_low"),
        pl.when(pl.col("arm") == "RREDCoT")
        .then(float("inf"))
        .otherwise(pl.col("steps_to_reference"))
        .alias("steps_to_reference"),
        pl.when(pl.col("arm") == "RREDCoT").then(-0.03).otherwise(pl.col("area_low")).alias("area_low"),
        pl.when(pl.col("arm") == "RREDCoT").then(-0.01).otherwise(pl.col("area_high")).alias("area_high"),
    )
    cost = cost.with_columns(
        pl.when(pl.col("item") == "RREDCoT")
        .then(3.0)
        .otherwise(pl.col("step_ratio_to_grpo"))
        .alias("step_ratio_to_grpo")
    )
    variance = variance.with_columns(pl.col("value_sd") / 10)
    attribution = attribution.with_columns(
        -pl.col("spearman"),
        (-pl.col("spearman_high")).alias("spearman_low"),
        (-pl.col("spearman_low")).alias("spearman_high"),
    )
    localisation = {"thinking": {"traces": 40, "top_blame_rate": 0.3, "chance": 0.2}}
    rows = {
        c.claim: c.verdict
        for c in CT.claims_table(
            cfg, paired, cost, truncation, attribution, prm, variance, localisation, SOURCES
        )
    }
    assert rows["rredcot_beats_grpo"] == "contradicted"
    assert rows["sample_efficiency"] == "contradicted"  # behind GRPO over the run
    assert rows["cost"] == "dearer"
    assert rows["mc_estimates_noisy"] == "contradicted"
    assert rows["rredcot_tracks_mc"] == "contradicted"
    assert rows["testbed_localisation"] == "contradicted"


def test_a_run_without_the_mc_arm_says_so(inputs):
    cfg, paired, cost, *rest = inputs
    cfg = {**cfg, "run_arms": ["grpo", "rredcot", "oracle"]}
    rows = {
        c.claim: c for c in CT.claims_table(cfg, paired, cost.filter(pl.col("item") != "MC"), *rest, SOURCES)
    }
    assert "mc_beats_grpo" not in rows
    assert rows["cost"].verdict == "within the paper's range" and "no MC arm" in rows["cost"].note
    md = MD.markdown(list(rows.values()), "x")
    assert md.count("\n| ") == len(rows) + 1 and "**supported**" in md
    # Every row has the header's seven cells: the PRM row's |Spearman| bars are escaped.
    table = [line for line in md.splitlines() if line.startswith("| ")]
    assert {line.replace("\\|", "").count("|") for line in table} == {8}


def test_too_little_to_judge_is_inconclusive(inputs):
    cfg, paired, cost, truncation, attribution, prm, variance, localisation = inputs
    # The reference never beat its start (reached at step 0); one trace of Monte Carlo values; an MC
    # arm that generated nothing.
    paired = paired.with_columns(pl.lit(None, pl.Float64).alias(c) for c in ("area", "area_low", "area_high"))
    variance = variance.with_columns(pl.lit(1).alias("traces"))
    cost = cost.with_columns(pl.lit(0.0).alias("rollout_tokens_per_step"))
    rows = {
        c.claim: c
        for c in CT.claims_table(
            cfg, paired, cost, truncation, attribution, prm, variance, localisation, SOURCES
        )
    }
    assert (
        rows["sample_efficiency"].verdict == "inconclusive"
        and "no learning curves" in rows["sample_efficiency"].note
    )
    assert rows["mc_estimates_noisy"].verdict == "inconclusive"
    assert rows["cost"].verdict == "within the paper's range" and "generated no rollouts" in rows["cost"].note


def test_a_difference_inside_the_threshold_is_too_small_to_matter(inputs):
    cfg, paired, *rest = inputs
    paired = paired.with_columns(
        pl.when(pl.col("arm") == "RREDCoT").then(-0.004).otherwise(pl.col("diff_low")).alias("diff_low"),
        pl.when(pl.col("arm") == "RREDCoT").then(0.004).otherwise(pl.col("diff_high")).alias("diff_high"),
    )
    rows = {c.claim: c.verdict for c in CT.claims_table(cfg, paired, *rest, SOURCES)}
    assert rows["rredcot_beats_grpo"] == "too small to matter"


def test_power_says_what_the_run_can_detect(inputs):
    _, paired, *_ = inputs
    power = {p.arm: p for p in PW.power_table(paired)}
    assert set(power) == {"RREDCoT", "MC", "Oracle", "Exact values", "RREDCoT - MC"}  # sampled rows only
    rredcot = power["RREDCoT"]
    assert rredcot.half_width == pytest.approx(0.03) and not rredcot.powered
    se = 0.03 / S.Z95
    assert rredcot.detectable == pytest.approx((S.Z95 + PW.Z80) * se)
    assert rredcot.detectable_by_size == pytest.approx(C.ACCURACY_THRESHOLD + (S.Z95 + PW.Z80) * se)
    # Seeds for ±0.01 from the two spreads: 1.96^2 (0.02^2 + 0.2^2 / 100) / 0.01^2 = 30.7 -> 31.
    assert rredcot.seeds_needed == 31
    # A difference of 0.01 is 0.005 beyond the threshold: an interval of ±0.005 decides it, 36 x the
    # seeds of today's ±0.03.
    assert rredcot.seeds_to_decide == math.ceil(3 * (0.03 / 0.005) ** 2) == 108
    assert PW.seeds_to_decide(0.002, 0.006, 20) == math.ceil(20 * (0.006 / 0.003) ** 2)  # too small to matter
    assert PW.seeds_to_decide(C.ACCURACY_THRESHOLD, 0.01, 20) is None
    md = MD.markdown([], "x", list(power.values()))
    assert "**Power: underpowered** for RREDCoT (±0.030)" in md
    assert "| RREDCoT | 3 x 100 |" in md and "| 31 | 108 |" in md
    tight = paired.with_columns(
        (pl.col("diff") - 0.008).alias("diff_low"), (pl.col("diff") + 0.008).alias("diff_high")
    )
    assert "**Power: powered.**" in MD.markdown([], "x", PW.power_table(tight))
    # One wide comparison among narrow ones is named alone, with the widest of the rest; where its
    # difference is already decided at that width (seeds to decide within the run's), the line says so.
    oracle_row = pl.col("arm") == "Oracle"
    one_wide = PW.power_table(
        tight.with_columns(
            pl.when(oracle_row).then(pl.col("diff") - 0.03).otherwise(pl.col("diff_low")).alias("diff_low"),
            pl.when(oracle_row).then(pl.col("diff") + 0.03).otherwise(pl.col("diff_high")).alias("diff_high"),
        )
    )
    oracle = next(p for p in one_wide if p.arm == "Oracle")
    banner = MD.markdown([], "x", one_wide).split("\n")[4]
    assert banner.startswith("**Power: underpowered** for Oracle (±0.030):")
    assert "Every other interval is within ±0.01 (widest ±0.008)." in banner
    assert ("Decided at their width all the same" in banner) == (oracle.seeds_to_decide <= oracle.seeds)
    far = [dataclasses.replace(p, seeds_to_decide=2) if p.arm == "Oracle" else p for p in one_wide]
    assert "Decided at their width all the same" in MD.markdown([], "x", far).split("\n")[4]
    near = [dataclasses.replace(p, seeds_to_decide=500) if p.arm == "Oracle" else p for p in one_wide]
    assert "Decided at their width" not in MD.markdown([], "x", near).split("\n")[4]


def test_without_the_exact_arm_the_testbed_check_is_open(inputs):
    cfg, *rest = inputs
    cfg = {**cfg, "run_arms": ["grpo", "rredcot", "oracle"]}
    rows = {c.claim: c for c in CT.claims_table(cfg, *rest, SOURCES)}
    assert rows["testbed_exact_beats_grpo"].verdict == "inconclusive"
    assert "no paired row for Exact values" in rows["testbed_exact_beats_grpo"].note
    assert "rredcot_matches_mc" not in rows and "rredcot_matches_mc_at_equal_compute" not in rows


def test_non_inferiority_judges_against_minus_the_threshold():
    t = C.ACCURACY_THRESHOLD
    assert S.verdict_not_below(-t + 0.001, 0.05, t) == "supported"
    assert S.verdict_not_below(-0.05, -t - 0.001, t) == "contradicted"
    assert S.verdict_not_below(-0.05, 0.05, t) == "inconclusive"
    assert S.verdict_not_below(None, 0.05, t) == "inconclusive"


def test_correlation_sizes_follow_the_fisher_interval():
    for rho in (0.0, 0.38, 0.65, -0.5):
        n = PW.correlation_n(rho)
        for m, fits in ((n, True), (n - 1, False)):
            low, high = S.fisher_interval(rho, m)
            assert (max(rho - low, high - rho) <= PW.CORRELATION_HALF_WIDTH) is fits
    # Near the approximation n = 3 + 1.06 (1.96 (1 - rho^2) / 0.1)^2, a little above: the wider side counts.
    assert PW.correlation_n(0.38) == pytest.approx(3 + 1.06 * (S.Z95 * (1 - 0.38**2) / 0.1) ** 2, rel=0.1)

    def verdict(a: float, b: float, n: int) -> str:
        half = math.hypot(
            *(
                max(r - lo, hi - r)
                for r, (lo, hi) in ((a, S.fisher_interval(a, n)), (b, S.fisher_interval(b, n)))
            )
        )
        return S.verdict_by_size(a - b - half, a - b + half, C.CORRELATION_DIFFERENCE_THRESHOLD)

    n = PW.difference_n(-0.6, 0.4)
    assert verdict(0.6, 0.4, n) == "supported" and verdict(0.6, 0.4, n - 1) == "inconclusive"
    n = PW.difference_n(0.079, -0.078)  # equal correlations: too small to matter, with enough pairs
    assert (
        verdict(0.079, 0.078, n) == "too small to matter" and verdict(0.079, 0.078, n - 1) == "inconclusive"
    )
    assert PW.difference_n(0.35, 0.3) is None  # on the line: no size decides


def test_power_of_the_correlations_scales_the_study(inputs):
    _, _, _, _, attribution, prm, *_ = inputs
    rows = PW.correlation_power(attribution, prm, n_traces=96)
    late, whole, thought, answer = rows
    assert (late.n, whole.n) == (60, 300) and late.rho == 0.7 and "last 20%" in late.what
    assert late.n_needed == PW.correlation_n(0.7)
    assert late.traces_needed == math.ceil(96 * late.n_needed / 60)
    assert thought.claim == answer.claim == "prm_follows_thought_nll" and thought.rho == 0.6
    assert thought.n_needed == max(PW.correlation_n(0.6), PW.difference_n(0.6, 0.1))
    assert late.design_effect == pytest.approx(1.0) and thought.design_effect == pytest.approx(1.0)
    md = MD.markdown([], "x", (), rows)
    assert "## Power of the correlations" in md and f"| {late.traces_needed} |" in md


def test_clustered_correlations_need_more_pairs(inputs):
    """Intervals as wide as a sixth of the pairs would give (a design effect of about 6): the pairs a study
    needs follow from the problems the pairs come from, and a claim the Fisher interval would decide can
    be inconclusive."""
    cfg, paired, cost, truncation, attribution, prm, variance, localisation = inputs
    problems = {60: 10, 150: 20, 300: 30, 200: 40}  # pairs -> problems: 6, 7.5, 10 and 5 pairs a problem
    wide_attr = _intervals(attribution.drop("spearman_low", "spearman_high"), design_effect=6.0)
    wide_prm = _intervals(prm.drop("spearman_low", "spearman_high"), design_effect=6.0)
    wide_attr, wide_prm = (
        t.with_columns(pl.col("n").replace_strict(problems).alias("clusters")) for t in (wide_attr, wide_prm)
    )
    late, whole, thought, answer = PW.correlation_power(wide_attr, wide_prm, n_traces=96)
    # About 6 over many pairs; more over few, where the interval's wider side grows faster than 1/√n.
    assert 5.0 < whole.design_effect < 7.0 and late.design_effect > 5.0
    assert late.problems == 10 and late.icc == pytest.approx((late.design_effect - 1) / (60 / 10 - 1))
    assert late.n_independent == PW.correlation_n(0.7)
    assert late.problems_needed == math.ceil(PW.correlation_n(0.7) * late.design_effect / 6)
    # icc near 1: ten problems are worth about ten pairs, whatever is drawn of them.
    assert late.n_needed is None and late.traces_needed is None
    assert whole.n_needed == PW.pairs_on_problems(PW.correlation_n(0.4), 30, whole.icc)
    assert late.half_width > PW.correlation_power(attribution, prm, n_traces=96)[0].half_width
    assert thought.n_independent == max(PW.correlation_n(0.6), PW.difference_n(0.6, 0.1))
    md = MD.markdown([], "x", (), [late, whole, thought, answer])
    assert "| out of reach | out of reach |" in md
    # The late correlation 0.7 over 60 pairs clears 0.3 as independent pairs, not at a sixth of them.
    rows = {
        c.claim: c
        for c in CT.claims_table(
            cfg, paired, cost, truncation, wide_attr, wide_prm, variance, localisation, SOURCES
        )
    }
    assert rows["rredcot_tracks_mc"].verdict == "inconclusive"
    assert rows["rredcot_tracks_mc"].low == pytest.approx(S.fisher_interval(0.7, int(57 / 6) + 3)[0])


def test_pairs_on_the_same_problems_are_worth_less():
    """N pairs over P problems with intra-problem correlation icc are worth N / (1 + (N / P - 1) icc)
    independent ones; the fewest N that reach a target, and None where the ceiling P / icc is below it."""

    def worth(n: int, problems: int, icc: float) -> float:
        return n / max(1.0, 1 + (n / problems - 1) * icc)

    for need, problems, icc in ((300, 400, 0.2), (1000, 400, 0.1), (5000, 400, 0.05), (700, 100, 0.1)):
        n = PW.pairs_on_problems(need, problems, icc)
        if need * icc >= problems:
            assert n is None
            continue
        assert worth(n, problems, icc) >= need - 1e-6 and worth(n - 1, problems, icc) < need
    assert PW.pairs_on_problems(300, 400, 0.5) == 300  # fewer than one pair a problem: independent
    assert PW.pairs_on_problems(7073, 400, 0.103) is None  # a correlation of 0.06 on 400 problems
    assert PW.pairs_on_problems(500, 400, 0.0) == 500


def test_absolute_correlation_intervals_and_missing_columns():
    assert S.abs_interval(0.1, 0.3) == (0.1, 0.3)
    assert S.abs_interval(-0.3, -0.1) == (0.1, 0.3)
    assert S.abs_interval(-0.1, 0.3) == (0.0, 0.3)
    assert all(math.isnan(x) for x in S.abs_interval(math.nan, 0.2))
    with pytest.raises(ValueError, match="redraw its figures"):
        C.correlation_interval({"spearman": 0.5, "n": 40})
    assert PW.design_effect(0.5, 100, *S.fisher_interval(0.5, 100)) == pytest.approx(1.0)
    assert PW.design_effect(0.5, 100, 0.49, 0.51) == 1.0  # never below independent pairs


def _prm_json(brier: float, constant: float = 0.10, auc: float = 0.7, steps: int = 600) -> dict:
    """A ``prm.json`` as rredcot study-prm-train writes it, reduced to what the PRM claim reads."""
    metrics = {"val_plain/brier": brier, "val_plain/brier_constant": constant}
    return {"metrics": metrics | {"val_plain/auc": auc, "val_plain/n_steps": float(steps)}}


def test_the_prm_claim_needs_a_prm_that_learned_step_values(inputs):
    cfg, paired, cost, truncation, attribution, prm, variance, localisation = inputs

    def claim(prm_model):
        table = CT.claims_table(
            cfg,
            paired,
            cost,
            truncation,
            attribution,
            prm,
            variance,
            localisation,
            SOURCES,
            COMPUTE,
            prm_model,
        )
        return next(c for c in table if c.claim == "prm_follows_thought_nll")

    # Brier skill 1 - 0.08 / 0.10 = 0.2: the PRM learned, its scores are judged (|-0.6| vs |0.1|).
    learned = claim(_prm_json(0.08))
    assert learned.verdict == "supported" and "Brier skill 0.200" in learned.measure
    # 0.095 / 0.10: skill 0.05, below the 0.09 a moderate correlation explains; a PRM worse than the
    # constant (skill < 0) and one without validation metrics neither stand for step correctness.
    for info in (_prm_json(0.095), _prm_json(0.11), {"metrics": {}}):
        c = claim(info)
        assert c.verdict == "inconclusive" and c.value == learned.value
        assert "has not learned step values" in c.note and "alone would be judged supported" in c.note
    assert C.PRM_MIN_SKILL == pytest.approx(C.CORRELATION_THRESHOLD**2)
    assert C.prm_skill(_prm_json(0.09))[0] == pytest.approx(0.1)
    assert "AUC 0.70, 600 steps" in C.prm_skill(_prm_json(0.09))[1]
    # A hub PRM has no prm.json: the correlations alone decide.
    assert claim(None).verdict == "supported" and "validation" not in claim(None).measure


def _public_inputs(inputs, run_arms):
    """The fixture's run with the field's public methods: SPO-chain ahead of GRPO, and RREDCoT behind it
    by more than the threshold at equal steps and at equal compute; PRIME ahead of GRPO by less than
    the threshold, with no pair with RREDCoT."""
    _, paired, *rest = inputs
    cfg = load_config("config/config.yaml", {"run_arms": run_arms})
    rows = [
        ("SPO-chain", "GRPO", "sampled", 3, 100, 0.02, 0.01, 0.03, 20.0, 10.0, 30.0)
        + (0.015, 0.008, 0.022, 0.01, 0.2),
        ("RREDCoT", "SPO-chain", "sampled", 3, 100, -0.03, -0.05, -0.01, 40.0, 30.0, 50.0)
        + (-0.01, -0.02, 0.0, 0.01, 0.2),
        ("PRIME", "GRPO", "sampled", 3, 100, 0.002, -0.002, 0.004, 25.0, 15.0, 35.0)
        + (0.001, -0.001, 0.003, 0.01, 0.2),
    ]
    spo = COMPUTE.with_columns(
        pl.lit("SPO-chain").alias("reference"),
        pl.lit(-0.03).alias("equal_compute_diff"),
        pl.lit(-0.05).alias("equal_compute_low"),
        pl.lit(-0.01).alias("equal_compute_high"),
    )
    return (cfg, pl.concat([paired, _paired(rows)]), *rest), pl.concat([COMPUTE, spo])


PUBLIC_ROWS = [
    "spo_beats_grpo",
    "spo_sample_efficiency",
    "rredcot_beats_spo",
    "rredcot_vs_spo_at_equal_compute",
    "prime_beats_grpo",
    "prime_sample_efficiency",
    "rredcot_beats_prime",
    "rredcot_vs_prime_at_equal_compute",
]


def test_public_methods_are_held_against_grpo_and_rredcot(inputs):
    """An spo or prime arm adds its four rows after the paper's claims, before the testbed's checks,
    and leaves every other row as it was; a pair the run did not make says where it comes from."""
    before = CT.claims_table(*inputs, SOURCES, COMPUTE)
    args, compute = _public_inputs(inputs, ["grpo", "rredcot", "mc", "oracle", "exact", "spo", "prime"])
    after = CT.claims_table(*args, SOURCES, compute)
    names = [c.claim for c in before]
    cut = names.index("testbed_exact_beats_grpo")
    assert [c.claim for c in after] == names[:cut] + PUBLIC_ROWS + names[cut:]
    assert [c for c in after if c.claim not in PUBLIC_ROWS] == before
    rows = {c.claim: c for c in after}
    assert {k: rows[k].verdict for k in PUBLIC_ROWS} == {
        "spo_beats_grpo": "supported",  # [0.01, 0.03]
        "spo_sample_efficiency": "supported",  # leads by [0.008, 0.022] over the run
        "rredcot_beats_spo": "contradicted",  # [-0.05, -0.01]: RREDCoT behind by more than 0.005
        "rredcot_vs_spo_at_equal_compute": "contradicted",  # [-0.05, -0.01] at equal seconds
        "prime_beats_grpo": "too small to matter",  # [-0.002, 0.004]
        "prime_sample_efficiency": "too small to matter",  # [-0.001, 0.003]
        "rredcot_beats_prime": "inconclusive",  # no pair
        "rredcot_vs_prime_at_equal_compute": "inconclusive",
    }
    assert rows["rredcot_beats_spo"].statement == (
        "RREDCoT reaches a higher final accuracy than SPO-chain at equal steps"
    )
    assert rows["rredcot_beats_spo"].value == -0.03 and rows["rredcot_beats_spo"].note == ""
    assert rows["spo_beats_grpo"].statement == "SPO-chain reaches a higher final accuracy than GRPO"
    equal = rows["rredcot_vs_spo_at_equal_compute"]
    assert "not behind SPO-chain" in equal.statement and equal.source == "compute.csv"
    for name in ("rredcot_beats_prime", "rredcot_vs_prime_at_equal_compute"):
        assert "report.pairs holds [rredcot, prime]" in rows[name].note
    # The Monte Carlo row at equal compute keeps its name and its note.
    assert rows["rredcot_matches_mc_at_equal_compute"].note.startswith("judged by size")


def test_public_methods_without_their_arm_add_no_rows(inputs):
    args, compute = _public_inputs(inputs, ["grpo", "rredcot", "spo"])
    names = [c.claim for c in CT.claims_table(*args, SOURCES, compute)]
    assert [n for n in names if n in PUBLIC_ROWS] == PUBLIC_ROWS[:4]
    args, compute = _public_inputs(inputs, ["grpo", "rredcot", "oracle"])
    assert not set(PUBLIC_ROWS) & {c.claim for c in CT.claims_table(*args, SOURCES, compute)}


def test_each_arm_names_claims_the_table_holds(inputs):
    run = ["grpo", "rredcot", "mc", "oracle", "exact", "spo", "prime"]
    args, compute = _public_inputs(inputs, run)
    names = {c.claim for c in CT.claims_table(*args, SOURCES, compute)}
    by_arm = CT.arm_claims(args[0])
    assert set(by_arm) == set(run) - {"grpo"}  # the reference has no claim against itself
    held = {n for c in by_arm.values() for n in vars(c).values() if n is not None}
    assert held <= names
    assert held & set(PUBLIC_ROWS) == {n for n in PUBLIC_ROWS if "sample_efficiency" not in n}
    assert by_arm["mc"] == CT.ArmClaims(
        "mc_beats_grpo", "rredcot_matches_mc", "rredcot_matches_mc_at_equal_compute"
    )
    assert by_arm["rredcot"] == CT.ArmClaims("rredcot_beats_grpo")


def _fidelity_row(key: str, method: str, samples: int | None, rho: float) -> dict:
    return {
        "key": key,
        "method": method,
        "samples": samples,
        "rho_trace": rho,
        "rho_trace_low": rho - 0.1,
        "rho_trace_high": rho + 0.1,
    }


FIDELITY = {
    "rows": [
        _fidelity_row("uniform", "uniform", None, 0.0),
        _fidelity_row("rredcot", "rredcot", None, 0.5),
        *(_fidelity_row(f"mc@{m}", "mc", m, 0.1 * m) for m in (2, 4, 8)),
        _fidelity_row("spo", "spo", None, 0.3),
    ],
    "skipped": {"prime": "needs prime_rewards, which the study cannot supply"},
}


def test_methods_table_puts_each_arm_beside_the_others(inputs):
    run = ["grpo", "rredcot", "mc", "spo", "prime"]
    args, compute = _public_inputs(inputs, run)
    cfg, paired, cost = args[0], args[1], args[2]
    cost = pl.concat(
        [cost, pl.DataFrame([{"item": "PRIME", "kind": "train", "step_ratio_to_grpo": 2.5}])], how="diagonal"
    ).with_columns(
        pl.when(pl.col("item") == "PRIME").then(3.25).otherwise(None).alias("extra_memory_gib"),
        pl.when(pl.col("item") == "MC").then(0.8).otherwise(None).alias("credit_s_per_step"),
    )
    claims = CT.claims_table(*args, SOURCES, compute)
    verdicts = {c.claim: c.verdict for c in claims}
    rows = {m.arm: m for m in MT.methods_table(cfg, claims, paired, cost, FIDELITY)}
    assert list(rows) == run
    grpo, rredcot, mc, spo, prime = rows.values()
    # The reference: no difference with itself, no claims; its uniform credit has a fidelity row.
    assert grpo.diff is None and grpo.claim_vs_reference is None and grpo.verdict_vs_reference is None
    assert (grpo.fidelity_key, grpo.rho_trace, grpo.step_ratio_to_grpo) == ("uniform", 0.0, 1.0)
    assert (rredcot.diff, rredcot.diff_low, rredcot.diff_high) == (0.01, -0.02, 0.04)
    assert (rredcot.area, rredcot.area_low, rredcot.area_high) == (0.02, 0.01, 0.03)
    assert rredcot.claim_rredcot_at_equal_steps is None and rredcot.verdict_vs_reference == "inconclusive"
    # MC at the budget it trains with (credit.mc.samples = 4), its claims the non-inferiority ones.
    assert mc.fidelity_key == "mc@4" and mc.rho_trace == pytest.approx(0.4)
    assert (mc.rho_trace_low, mc.rho_trace_high) == (pytest.approx(0.3), pytest.approx(0.5))
    assert (mc.step_ratio_to_grpo, mc.credit_s_per_step) == (9.0, 0.8)
    assert (mc.claim_rredcot_at_equal_steps, mc.verdict_rredcot_at_equal_steps) == (
        "rredcot_matches_mc",
        verdicts["rredcot_matches_mc"],
    )
    assert mc.verdict_rredcot_at_equal_compute == "supported"
    assert (spo.diff, spo.fidelity_key, spo.rho_trace) == (0.02, "spo", 0.3)
    assert (spo.verdict_vs_reference, spo.verdict_rredcot_at_equal_steps) == ("supported", "contradicted")
    assert spo.claim_rredcot_at_equal_compute == "rredcot_vs_spo_at_equal_compute"
    assert spo.verdict_rredcot_at_equal_compute == "contradicted"
    # PRIME: the study skipped it, so no fidelity; its extra model's memory from cost.csv.
    assert prime.fidelity_key is None and prime.rho_trace is None
    assert (prime.step_ratio_to_grpo, prime.extra_memory_gib) == (2.5, 3.25)
    assert prime.verdict_vs_reference == "too small to matter"
    assert prime.verdict_rredcot_at_equal_steps == "inconclusive"
    # An arm trained at another budget is read at it; off the synthetic task there is no fidelity.
    arms = {"mc": {"credit_options": {"mc": {"samples": 8}}}}
    other = load_config("config/config.yaml", {"run_arms": run, "arms": arms})
    assert MT.methods_table(other, claims, paired, cost, FIDELITY)[2].fidelity_key == "mc@8"
    assert all(m.rho_trace is None for m in MT.methods_table(cfg, claims, paired, cost, None))
    # claims.md: the section after the claims, before the power; intervals in brackets.
    md = MD.markdown(claims, "x", PW.power_table(paired), (), list(rows.values()))
    section = md[md.index("## Methods side by side") : md.index("## Power of the accuracy")]
    table = [line for line in section.splitlines() if line.startswith("| ")]
    assert len(table) == 1 + len(run)
    assert {line.count("|") for line in table} == {11}
    assert "| SPO-chain | 0.020 [0.010, 0.030] | 0.015 [0.008, 0.022] | 0.300 [0.200, 0.400] |" in section
    assert "0.400 [0.300, 0.500] (`mc@4`)" in section
    assert "contradicted (`rredcot_beats_spo`)" in section and "| 3.250 |" in section
    assert "| GRPO | - | - | 0.000 [-0.100, 0.100] | 1.000 |" in section
    assert "## Methods side by side" not in MD.markdown(claims, "x")
