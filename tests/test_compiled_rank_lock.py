"""TRAIL's limited preemption with a rank predictor, compiled: locked rows sort first whatever the scores.

``trail-preemption`` gives a locked row the key ``LOCKED_KEY`` (-inf), below every countdown key and
every rank score, negative ones included (a key of -inf ties with it, in row order). The kernel
merges its locked rows into the residents' (key, row) order at that key; both kernels, byte for byte.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

if importlib.util.find_spec("numba") is None:
    pytest.skip("numba is not installed (extra `fast`): the compiled kernel falls back", allow_module_level=True)

from core.trace import trace_from_arrays  # noqa: E402
from policies import make_policy  # noqa: E402
from policies.base import SchedulerView  # noqa: E402
from simulator.compiled import unsupported  # noqa: E402
from simulator.engine import Simulation  # noqa: E402
from simulator.profiles import make_profile  # noqa: E402
from simulator.profiles.unit import UnitProfile  # noqa: E402
from simulator.runner import RunConfig, run_simulation  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_compiled import assert_identical, replay_both  # noqa: E402
from test_invariants import HYPO, FixedPredictor, cases, vllm_cases  # noqa: E402

#: rank scores of either sign, some below the old locked key -1, ties, and -inf (ties with a locked row)
SCORES = st.one_of(st.integers(-30, 30).map(float), st.floats(-1e3, 1e3, allow_nan=False),
                   st.sampled_from([-1.0, -math.inf, 0.0]))


class RankScores(FixedPredictor):
    """A rank-only predictor: a fixed score per request, lower served first."""

    name = "rank-scores"
    output = "rank"


def run(case, scores, kernel: str):
    wl = trace_from_arrays("hypo", case.prompt, case.output)
    sim = Simulation(wl, np.asarray(case.arrival, dtype=np.float64), policy=make_policy("trail-preemption"),
                     predictor=RankScores(scores), profile=UnitProfile() if case.step_time == "unit"
                     else make_profile("qwen3-8b-h100"), config=case.config, seed=case.seed,
                     closed_loop=case.closed_loop)
    assert kernel == "reference" or unsupported(sim) is None
    return run_simulation(sim, kernel)


@settings(max_examples=300, **HYPO)
@given(st.one_of(cases(policies=("trail-preemption",), predictors=("fixed",)),
                 vllm_cases(policies=("trail-preemption",), predictors=("fixed",))), st.data())
def test_rank_scores_under_trail_preemption(case, data):
    """Scores of any sign (the lock is ``generated > 0.8 x first score``, so a negative first score
    locks a row as soon as it holds a slot), with the wait cap forcing rows in beside the locked."""
    scores = data.draw(st.lists(SCORES, min_size=len(case.prompt), max_size=len(case.prompt)))
    assert_identical(run(case, scores, "reference"), run(case, scores, "compiled"))


def test_locked_rows_sort_below_every_rank_score():
    """The reference's rule itself: a locked row precedes a row scored below the old key -1."""
    policy = make_policy("trail-preemption")
    view = SchedulerView(now=0.0, arrival_s=np.zeros(3), predicted=np.array([-5.0, -7.0, 2.0]),
                         generated=np.array([3, 0, 0]), output_kind="rank", step=4,
                         last_served=np.array([3, 0, 0]), first_predicted=np.array([-5.0, -7.0, 2.0]))
    keys = policy.decode_keys(view, np.arange(3))
    assert np.argsort(keys, kind="stable").tolist() == [0, 1, 2]


def test_ltr_under_trail_preemption_on_a_recorded_trace():
    """LTR's scores on sharegpt at 1.5x, compiled."""
    replay_both(RunConfig(trace="sharegpt", predictor="ltr", policy="trail-preemption", load=1.5))
