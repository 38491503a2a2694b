"""Paired bootstrap intervals of arm differences and of steps-to-reach."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rredcot.infra.stats import paired_difference, steps_to_reach, steps_to_reach_reference


def test_a_clear_gain_excludes_zero_and_no_gain_does_not():
    rng = np.random.default_rng(0)
    reference = (rng.random((5, 200)) < 0.5).astype(float)
    better = np.maximum(reference, (rng.random((5, 200)) < 0.3))  # fixes about 15% of the problems
    gain = paired_difference(better, reference, n_boot=500, seed=0)
    assert gain.estimate == pytest.approx((better - reference).mean())
    assert gain.low > 0.05 and gain.excludes_zero()
    same = paired_difference(reference, reference, n_boot=200, seed=0)
    assert same.estimate == same.low == same.high == 0.0 and not same.excludes_zero()
    noise = paired_difference((rng.random((5, 200)) < 0.5).astype(float), reference, n_boot=500, seed=0)
    assert noise.low < 0 < noise.high


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 4), st.integers(1, 30), st.integers(0, 2**31 - 1))
def test_the_interval_holds_the_estimate_and_is_paired(n_seeds, n_problems, seed):
    rng = np.random.default_rng(seed)
    ref = rng.random((n_seeds, n_problems))
    shifted = paired_difference(ref + 0.25, ref, n_boot=100, seed=seed)
    # A constant shift is the same in every resample: pairing leaves no spread at all.
    assert shifted.low == pytest.approx(0.25) and shifted.high == pytest.approx(0.25)
    other = paired_difference(rng.random((n_seeds, n_problems)), ref, n_boot=100, seed=seed)
    assert other.low - 1e-12 <= other.high and -1 <= other.low and other.high <= 1


def test_paired_difference_rejects_unpaired_shapes():
    with pytest.raises(ValueError, match="one shape"):
        paired_difference(np.zeros((2, 3)), np.zeros((3, 3)), 100, 0)
    with pytest.raises(ValueError, match="level"):
        paired_difference(np.zeros((2, 3)), np.zeros((2, 3)), 100, 0, level=1.0)


def test_steps_to_reach():
    assert steps_to_reach([0, 10, 20], [0.1, 0.5, 0.7], 0.5) == 10
    assert steps_to_reach([0, 10, 20], [0.1, 0.5, 0.7], 0.8) == math.inf


def test_steps_to_reach_reference():
    steps = [0, 10, 20, 30, 40]
    reference = np.array([[0.2, 0.3, 0.4, 0.5, 0.6]] * 3)
    faster = np.array([[0.2, 0.4, 0.6, 0.7, 0.8]] * 3)
    got = steps_to_reach_reference(steps, faster, reference, n_boot=100, seed=0)
    assert (got.estimate, got.low, got.high) == (20, 20, 20)
    assert steps_to_reach_reference(steps, reference, reference, n_boot=50, seed=0).estimate == 40
    slower = reference - 0.1
    assert steps_to_reach_reference(steps, slower, reference, n_boot=50, seed=0).high == math.inf


def test_paired_area_is_the_mean_lead_over_the_run():
    from rredcot.infra.stats import paired_area

    steps = [0, 10, 20, 40]
    reference = np.array([[0.5, 0.6, 0.7, 0.8], [0.5, 0.6, 0.7, 0.8]])
    # Seed 0 leads by 0.02 at every probe but the first; seed 1 by 0.04 from step 10 on.
    arm = reference + np.array([[0.0, 0.02, 0.02, 0.02], [0.0, 0.04, 0.04, 0.04]])
    got = paired_area(steps, arm, reference, n_boot=500, seed=0)
    # Trapezoids: (0 + d) / 2 * 10 + d * 10 + d * 20 = 35 d over 40 steps.
    assert got.estimate == pytest.approx((35 * 0.02 / 40 + 35 * 0.04 / 40) / 2)
    assert 35 * 0.02 / 40 - 1e-12 <= got.low <= got.estimate <= got.high <= 35 * 0.04 / 40 + 1e-12
    with pytest.raises(ValueError):
        paired_area([0], arm[:, :1], reference[:, :1], n_boot=10, seed=0)


def test_seed_sd_splits_the_spread_over_seeds_and_problems():
    from rredcot.infra.stats import seed_sd

    reference = np.zeros((3, 4))
    arm = np.array([[0.0, 1.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    between, within = seed_sd(arm, reference)
    assert between == pytest.approx(np.std([0.5, 1.0, 0.0], ddof=1))
    assert within == pytest.approx(np.sqrt(np.mean([np.var([0, 1, 0, 1], ddof=1), 0.0, 0.0])))


def test_a_stalled_step_counts_at_the_runs_median():
    """A job suspended for 44 minutes in its 14th step (its clock ran on) is charged a median step
    there, and a step a few times the median (a long generation) stays as it was."""
    from rredcot.infra.stats import STALL_FACTOR, cumulative_seconds, without_stalls

    times = {k: 0.75 for k in range(1, 41)} | {14: 2657.0, 20: 3.5}
    clean, stalled = without_stalls(times)
    assert stalled == [14] and clean[14] == 0.75 and clean[20] == 3.5
    assert cumulative_seconds(clean, [40]).tolist() == [pytest.approx(39 * 0.75 + 3.5)]
    assert without_stalls({1: 1.0, 2: 1.0, 3: STALL_FACTOR})[1] == []  # at the line: not a stall
    assert without_stalls({1: 1.0, 2: 1.0, 3: STALL_FACTOR + 0.1})[1] == [3]
    assert without_stalls({}) == ({}, [])


def test_cumulative_seconds_sum_the_steps_up_to_each_probe():
    from rredcot.infra.stats import cumulative_seconds

    times = {1: 2.0, 2: 3.0, 3: 1.0, 4: 4.0}
    assert cumulative_seconds(times, [0, 2, 4]).tolist() == [0.0, 5.0, 10.0]
    # A step without a time would undercount what the run cost.
    with pytest.raises(ValueError, match=r"step\(s\) \[3\]"):
        cumulative_seconds({1: 2.0, 2: 3.0, 4: 4.0}, [0, 4])


def test_seconds_to_reach_interpolates_between_probes():
    from rredcot.infra.stats import seconds_to_reach

    seconds, curve = [0.0, 10.0, 20.0], [0.2, 0.4, 0.8]
    assert seconds_to_reach(seconds, curve, 0.6) == pytest.approx(15.0)  # half way from 0.4 to 0.8
    assert seconds_to_reach(seconds, curve, 0.4) == 10.0
    assert seconds_to_reach(seconds, curve, 0.1) == 0.0
    assert seconds_to_reach(seconds, curve, 0.9) == math.inf


# Two seeds; the second ran on a machine twice as slow. The arm's steps cost half the reference's,
# and the reference is probed once more than the arm.
_ARM_SECONDS = np.array([[0.0, 10.0, 20.0], [0.0, 20.0, 40.0]])
_REF_SECONDS = np.array([[0.0, 20.0, 30.0, 40.0], [0.0, 40.0, 60.0, 80.0]])
_REFERENCE = np.array([[0.2, 0.6, 0.7, 0.8], [0.2, 0.4, 0.6, 0.9]])


def test_cost_shares_are_means_over_seeds():
    from rredcot.infra.stats import cost_shares

    assert cost_shares(_ARM_SECONDS, _REF_SECONDS) == pytest.approx((30.0, 60.0, 0.5))
    with pytest.raises(ValueError, match="same seeds"):
        cost_shares(_ARM_SECONDS[:1], _REF_SECONDS)


def test_equal_compute_reads_both_curves_at_the_cheaper_runs_end():
    from rredcot.infra.stats import equal_compute_difference

    arm = np.array([[0.2, 0.4, 0.6], [0.2, 0.5, 0.7]])
    got = equal_compute_difference(_ARM_SECONDS, arm, _REF_SECONDS, _REFERENCE, n_boot=500, seed=0)
    # Seed 0 at 20 s: 0.6 - 0.6; seed 1 at 40 s: 0.7 - 0.4. The reference's final 0.8, 0.9 never count.
    assert got.estimate == pytest.approx(0.15)
    assert -1e-12 <= got.low <= got.estimate <= got.high <= 0.3 + 1e-12 and got.low < got.high
    # Against itself every seed's difference is 0, whatever the resample.
    same = equal_compute_difference(_REF_SECONDS, _REFERENCE, _REF_SECONDS, _REFERENCE, n_boot=50, seed=0)
    assert same.estimate == same.low == same.high == 0.0
    with pytest.raises(ValueError, match="same seeds"):
        equal_compute_difference(_ARM_SECONDS[:1], arm[:1], _REF_SECONDS, _REFERENCE, n_boot=10, seed=0)
    with pytest.raises(ValueError, match="one shape"):
        equal_compute_difference(_ARM_SECONDS, arm[:, :2], _REF_SECONDS, _REFERENCE, n_boot=10, seed=0)


def test_reach_share_is_a_share_of_the_references_seconds():
    from rredcot.infra.stats import reach_share

    arm = np.array([[0.2, 0.6, 1.0], [0.2, 0.6, 1.0]])
    got = reach_share(_ARM_SECONDS, arm, _REF_SECONDS, _REFERENCE, n_boot=500, seed=0)
    # The arm's mean curve: 0.2, 0.6, 1.0 at 0, 15, 30 s. It crosses the reference's final mean
    # (0.85) at 15 + 0.25 / 0.4 * 15 = 24.375 s, of the reference's mean 60 s.
    assert got.estimate == pytest.approx(24.375 / 60)
    # Resamples of one seed only: 15 s of 40 (target 0.8), 35 s of 80 (target 0.9).
    assert 15 / 40 - 1e-12 <= got.low <= got.estimate <= got.high <= 35 / 80 + 1e-12
    # An arm that never reaches the reference's final accuracy within its run.
    slow = np.array([[0.2, 0.4, 0.6], [0.2, 0.5, 0.7]])
    never = reach_share(_ARM_SECONDS, slow, _REF_SECONDS, _REFERENCE, n_boot=100, seed=0)
    assert never.estimate == never.low == never.high == math.inf
    # The reference against itself reaches its final accuracy at its full cost, or sooner.
    itself = reach_share(_REF_SECONDS, _REFERENCE, _REF_SECONDS, _REFERENCE, n_boot=100, seed=0)
    assert itself.estimate == pytest.approx(1.0) and itself.high <= 1.0 + 1e-12
