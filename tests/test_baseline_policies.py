"""The baselines' scheduler-side policies: SSJF's starvation override, LTR's starvation promotion
and reset, TRAIL's limited preemption (shared parts: tests/baseline_cases.py).
"""

from __future__ import annotations

import baseline_cases  # noqa: E402
import numpy as np
from baseline_cases import (  # noqa: E402, F401
    _view,
)

from policies import make_policy

# the shared fixtures, with their scopes
_private_cache = baseline_cases._private_cache


def test_ssjf_starvation_override():
    policy = make_policy("ssjf-starvation")
    rows = np.arange(3)
    # predicted 10, 500, 50 tokens; oldest (row 0) waited 1 s: no override -> shortest remaining first
    view = _view(arrival_s=np.array([9.0, 9.5, 9.9]), now=10.0, predicted=np.array([500.0, 10.0, 50.0]))
    assert np.argsort(policy.decode_keys(view, rows), kind="stable").tolist() == [1, 2, 0]
    # waited 101 s > 100 s -> waiting-time order for this decision
    view.now = 110.0
    assert np.argsort(policy.decode_keys(view, rows), kind="stable").tolist() == [0, 1, 2]
    # 10x its predicted execution: 0.1 + 0.02 * 500 = 10.1 s -> wait 101.5 s > 101 s (also > 100)
    view = _view(arrival_s=np.array([0.0, 1.0]), now=30.0, predicted=np.array([100.0, 5.0]))
    # exec = 0.1 + 2 = 2.1 s, 10x = 21 s < 30 s wait -> override
    assert np.argsort(policy.admission_keys(view, np.arange(2)), kind="stable").tolist() == [0, 1]
    view.now = 20.0                                                   # 20 s < 21 s -> by prediction
    assert np.argsort(policy.admission_keys(view, np.arange(2)), kind="stable").tolist() == [1, 0]


def test_ltr_starvation_promotion_for_ten_runs():
    policy = make_policy("ltr-starvation")
    policy.reset(3)
    rows = np.arange(3)
    scores = np.array([5.0, 1.0, 2.0])                                # rank scores, lower first
    last = np.array([0, 299, 299])
    view = _view(arrival_s=np.zeros(3), predicted=scores, output_kind="rank", step=300, last_served=last)
    keys = policy.decode_keys(view, rows)                             # row 0 idle 299 >= 200 -> top
    assert np.argsort(keys, kind="stable")[0] == 0
    for run in range(1, 11):                                          # it runs in the next steps
        view.step += 1
        view.last_served[0] = view.step - 1
        view.last_served[1:] = view.step - 1
        keys = policy.decode_keys(view, rows)
        assert (np.argsort(keys, kind="stable")[0] == 0) == (run < 10), run
    assert np.argsort(keys, kind="stable").tolist() == [1, 2, 0]      # back to its score after 10 runs
    # idle 199 is not enough
    view = _view(arrival_s=np.zeros(2), predicted=np.array([5.0, 1.0]), output_kind="rank", step=200,
                 last_served=np.array([0, 199]))
    fresh = make_policy("ltr-starvation")
    fresh.reset(2)
    assert np.argsort(fresh.decode_keys(view, np.arange(2)), kind="stable")[0] == 1


def test_ltr_starvation_reset_starts_a_new_run():
    """The engine calls reset(n) at the start of each run: promotions of the last run do not leak
    into the next, even when the new run's view reuses the same arrays."""
    policy = make_policy("ltr-starvation")
    policy.reset(2)
    view = _view(arrival_s=np.zeros(2), predicted=np.array([5.0, 1.0]), output_kind="rank", step=300,
                 last_served=np.array([0, 299]))
    assert np.argsort(policy.decode_keys(view, np.arange(2)), kind="stable")[0] == 0   # row 0 promoted
    policy.reset(2)
    view.step, view.last_served[:] = 10, [9, 9]                       # a new run: nobody idle
    assert np.argsort(policy.decode_keys(view, np.arange(2)), kind="stable")[0] == 1


def test_trail_limited_preemption():
    policy = make_policy("trail-preemption")
    rows = np.arange(3)
    # row 0: 90 of an initial 100 generated (> 0.8 x 100), held a slot last step -> keeps it
    view = _view(arrival_s=np.zeros(3), predicted=np.array([400.0, 100.0, 60.0]), generated=np.array([90, 10, 10]),
                 first_predicted=np.array([100.0, 100.0, 60.0]), step=50, last_served=np.array([49, 49, 49]))
    keys = policy.decode_keys(view, rows)
    assert np.argsort(keys, kind="stable").tolist() == [0, 2, 1]
    view.last_served[0] = 40                                          # not running: ordinary key
    assert np.argsort(policy.decode_keys(view, rows), kind="stable").tolist() == [2, 1, 0]
    view.last_served[0] = 49
    view.generated[0] = 80                                            # exactly 0.8 x: still preemptible
    assert np.argsort(policy.decode_keys(view, rows), kind="stable").tolist() == [2, 1, 0]
