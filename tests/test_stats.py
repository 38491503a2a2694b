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
