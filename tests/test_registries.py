"""Every registered predictor x policy x engine profile runs on a small trace and keeps the engine's
invariants, so a new entry is covered the moment it is registered (no list to update here).

The three starvation / preemption policies (ssjf-starvation, ltr-starvation, trail-preemption) are
exempt from the brute-force reference simulator (tests/reference_sim.py implements fcfs, countdown
and aging): they re-implement other systems' stateful heuristics, whose rules are pinned by their
own worked examples in tests/test_baselines.py. Here they run through the same invariant checks
(conservation, limits, causality, monotone clock, work conservation) as every other policy.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from core.trace import load_trace
from policies import POLICIES, make_policy
from predictors import BASELINES, LEARNED, ORACLES, PREDICTORS, make_predictor
from predictors.heads import HeadPredictor
from simulator.engine import EngineConfig, Simulation
from simulator.profiles import PROFILES, make_profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_invariants import ALL_CHECKS  # noqa: E402

N = 48
CONFIG = EngineConfig(max_resident=24, decode_slots=4, prefill_token_budget=4096, wait_cap=16)


@pytest.fixture(scope="module")
def small():
    trace = load_trace("lmsys")
    return trace, trace.take(np.arange(N))


@pytest.fixture(scope="module")
def predictors():
    """Built once per module: predictors (each run binds its own workload) and engine profiles."""
    return {}


@pytest.mark.parametrize("engine", list(PROFILES))
@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("predictor", ["none", *PREDICTORS])
def test_every_registered_combination_runs_and_keeps_the_invariants(predictor, policy, engine, small, predictors):
    trace, workload = small
    if predictor == "none" and POLICIES[policy].uses_predictions:
        pytest.skip(f"{policy} needs a predictor")
    if predictor != "none" and predictor not in predictors:
        predictors[predictor] = make_predictor(predictor)   # trained or loaded once; each run binds it
    arrival = np.arange(N) * 0.05                          # a burst: more ready requests than decode slots
    profile = predictors.setdefault(("profile", engine), None) or make_profile(engine, trace)
    predictors[("profile", engine)] = profile
    result = Simulation(workload, arrival, policy=make_policy(policy, slos=(("ttft", 500.0), ("tpot", 50.0))),
                        predictor=predictors.get(predictor),
                        profile=profile, config=CONFIG, seed=1, record_steps=True).run()
    for check in ALL_CHECKS:
        check(result, CONFIG)
    assert result.contended_steps > 0, "the policy never chose: the combination was not exercised"
    if predictor != "none":
        assert np.isfinite(result.predicted_tokens).all(), "some request never got an estimate"


def test_derived_lists_follow_the_registry():
    assert set(LEARNED) == {n for n, c in PREDICTORS.items() if c.learned}
    assert not set(ORACLES) & set(LEARNED), "an oracle reads the true lengths: it cannot also be learned"
    assert set(LEARNED) == {"leap", "leap-rls", *BASELINES}
    assert set(ORACLES) == {"oracle", "noisy-oracle"}
    assert set(BASELINES) == {n for n, c in PREDICTORS.items() if issubclass(c, HeadPredictor)}
    import scripts.train_baselines as train
    assert train.BASELINES is BASELINES


#: Policies the brute-force reference does not model, each pinned instead by its own worked examples
#: (tests/test_baselines.py). A new policy must join the reference or this list, by decision.
REFERENCE_EXEMPT = {"ssjf-starvation", "ltr-starvation", "trail-preemption",
                    # the prediction-free and slack policies: held by their hand examples and property
                    # tests (tests/test_policies_baselines.py) and compiled == reference byte for byte
                    "hrrn", "mlfq", "boost", "priority", "edf", "slack-countdown", "slack-mlfq"}


def test_every_policy_is_in_the_reference_or_exempt_by_name():
    from reference_sim import POLICIES as MODELLED
    missing = set(POLICIES) - set(MODELLED) - REFERENCE_EXEMPT
    assert not missing, f"policies neither modelled by tests/reference_sim.py nor in REFERENCE_EXEMPT: {missing}"
    assert not set(MODELLED) & REFERENCE_EXEMPT and set(MODELLED) <= set(POLICIES)


def test_reference_refuses_a_policy_it_does_not_model():
    from reference_sim import NotModelled, simulate
    with pytest.raises(NotModelled, match="trail-preemption"):
        simulate([4, 4], [2, 2], [0.0, 0.0], policy="trail-preemption", predicted=[1.0, 2.0])
