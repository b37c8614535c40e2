"""TIE's score (against Monte Carlo, its queue estimate, the counts it is given) and TRAIL's
smoothing and refresh (shared parts: tests/baseline_cases.py).
"""

from __future__ import annotations

import baseline_cases  # noqa: E402
import numpy as np
import pytest
from baseline_cases import (  # noqa: E402, F401
    untrained_trail,
)

from policies.base import SchedulerView
from predictors.base import Known
from simulator.engine import EngineConfig, Simulation
from simulator.profiles import make_profile

# the shared fixtures, with their scopes
_private_cache = baseline_cases._private_cache
synth_path = baseline_cases.synth_path   # synth_test is built on it
synth_test = baseline_cases.synth_test


# ----------------------------------------------------------------------------- TIE's score
@pytest.mark.parametrize("mu,sigma,beta", [(5.0, 0.8, 0.3), (6.5, 1.2, 0.5), (3.0, 0.3, 0.1), (2.0, 2.5, 0.4)])
def test_tie_score_matches_high_sample_monte_carlo(mu, sigma, beta):
    from predictors.tie import tie_score, tie_score_monte_carlo
    exact = float(tie_score(mu, sigma, beta)[0])
    mc = tie_score_monte_carlo(mu, sigma, beta, samples=2_000_000, seed=7)
    assert exact == pytest.approx(mc, rel=0.01)
    assert float(tie_score(mu, sigma, beta)[0]) == exact            # deterministic


def test_tie_beta_and_queue_estimate():
    from predictors.tie import tie_beta
    assert tie_beta(0, 64) == 0.1 and tie_beta(192, 64) == pytest.approx(0.3) and tie_beta(10_000, 64) == 0.5


def test_tie_scores_from_the_counts_it_is_given_not_row_numbers(synth_test):
    """L_q comes from the arrived/finished counts the engine passes, whatever rows are asked."""
    from predictors.tie import Tie
    tie = Tie.__new__(Tie)
    tie.batch, tie.nu = 64, 3.5
    tie._mu, tie._sigma = np.full(4, 5.0), np.full(4, 1.0)
    rows = np.array([0])
    calm, busy = Known(arrived=1, finished=0), Known(arrived=1000, finished=0)
    assert tie.queue_estimate(calm) == 0 and tie.queue_estimate(busy) == 1000 - 64
    assert tie.predict(rows, busy)[0] > tie.predict(rows, calm)[0]      # a longer queue weighs the tail more
    assert tie.predict(np.array([3]), calm)[0] == tie.predict(rows, calm)[0]   # row 3 does not mean 4 arrived
    with pytest.raises(ValueError, match="known"):
        tie.predict(rows)


# ----------------------------------------------------------------------------- TRAIL
def test_trail_smoothing_matches_hand_computed_posterior():
    from predictors.trail import smooth, transition_matrix
    T = transition_matrix(3, 2.0)                                    # p = 1/2
    np.testing.assert_allclose(T, [[1, 0, 0], [0.5, 0.5, 0], [0, 0.5, 0.5]])
    post = np.array([0.2, 0.3, 0.5])
    # k = 2: prior = post @ T^2 = [0.55, 0.325, 0.125]; x [0.1, 0.6, 0.3] -> [22, 78, 15] / 115
    post = smooth(post, np.array([0.1, 0.6, 0.3]), 2, T)
    np.testing.assert_allclose(post[0], np.array([22, 78, 15]) / 115, rtol=1e-12)
    # k = 1: prior = [61, 46.5, 7.5] / 115; x [0.5, 0.25, 0.25] -> [61/88, 93/352, 15/352]
    post = smooth(post, np.array([0.5, 0.25, 0.25]), 1, T)
    np.testing.assert_allclose(post[0], [61 / 88, 93 / 352, 15 / 352], rtol=1e-12)
    # TRAIL's own bins: p = min(1, 1 / bin_size)
    assert transition_matrix(10, 102.4)[5, 4] == pytest.approx(1 / 102.4)
    assert transition_matrix(10, 0.5)[5, 4] == 1.0


def test_trail_refresh_uses_recorded_vectors_and_counts_down_exactly(synth_test):
    from policies.countdown import remaining
    from predictors.trail import smooth
    test = synth_test
    trail = untrained_trail(test)
    trail.bind(test, np.random.default_rng(0))
    assert trail.refresh_every == 64
    lengths = test.output_tokens
    row = int(np.flatnonzero(lengths > 300)[0])
    rows = np.array([row])
    prior = trail.post[row].copy()
    first = float(trail.predict(rows)[0])
    # by hand: prefill observation at g = 1, then the vector recorded at g = 64
    drows, gen, vecs = test.decode_vectors(10)
    vec64 = vecs[(drows == row) & (gen == 64)]
    assert len(vec64) == 1
    post = smooth(prior, trail.probe_probabilities(test.feature("feat_mean")[rows]), 1, trail.T)
    post = smooth(post, trail.probe_probabilities(vec64), 63, trail.T)
    expected = 64 + float(np.clip(post @ trail.mid, 1, 1024 - 64)[0])
    got = float(trail.refresh(rows, np.array([64]))[0])
    # rel 1e-6, not exact: the hand computation runs the probe on one row, bind on all rows at once,
    # and a float32 matrix product's last bit can depend on the batch's shape (BLAS kernels)
    assert got == pytest.approx(expected, rel=1e-6) and got != first
    # between refreshes the total stays put, so countdown's key falls by exactly one per token
    view = SchedulerView(now=0.0, arrival_s=np.zeros(1), predicted=np.array([got]), generated=np.array([64]),
                         output_kind="length")
    keys = []
    for g in range(64, 128):
        view.generated[0] = g
        keys.append(float(remaining(view, np.array([0]))[0]))
    assert np.allclose(np.diff(keys), -1.0) or min(keys) == 0.5
    # a refresh with no newer vector than the one already used changes nothing
    assert float(trail.refresh(rows, np.array([64]))[0]) == got
    # the same evidence through the (proposed) engine hook after prefill gives the same posterior
    hooked = untrained_trail(test)
    hooked.bind(test, np.random.default_rng(0))
    after = float(hooked.after_prefill(rows)[0])
    assert after != first and float(hooked.refresh(rows, np.array([64]))[0]) == pytest.approx(got, rel=1e-12)


def test_trail_predictions_change_only_at_refresh_points(synth_test):
    """Through the engine: a request's estimate is constant between multiples of k = 64."""
    from policies.countdown import Countdown

    class Spy(Countdown):
        name = "countdown"
        seen: list = []

        def decode_keys(self, view, rows):
            self.seen.append((rows.copy(), view.generated[rows].copy(), view.predicted[rows].copy()))
            return super().decode_keys(view, rows)

    test = synth_test
    spy = Spy()
    sim = Simulation(test, np.zeros(len(test)), policy=spy, predictor=untrained_trail(test),
                     profile=make_profile("unit"), config=EngineConfig(decode_slots=8, wait_cap=0))
    sim.run()
    last: dict[int, tuple[int, float]] = {}
    changes = 0
    for rows, gen, pred in spy.seen:
        for r, g, p in zip(rows.tolist(), gen.tolist(), pred.tolist()):
            if r in last and last[r][0] // 64 == g // 64:
                assert p == last[r][1], f"row {r}: estimate moved between refreshes ({last[r]} -> {g}, {p})"
            elif r in last and p != last[r][1]:
                changes += 1
            last[r] = (g, p)
    assert changes > 0
