"""The fleet's rules pinned by hand (docs/semantics.md "Fleets"), each where a one-line bug used to
pass every test: least-work reads an estimate less the tokens generated (not the total);
power-of-two's tie goes to the lower of the two drawn replicas; a step ending exactly at an arrival
lands before the routing (steps of the unit engine end at integer instants, so staggered integer
arrivals meet them); a predictor event at the arrival instant, while a replica's step runs past
it, fires after the routing. Each is checked on both kernels: the reference fleet and the
compiled fleet must agree with the hand result and with each other."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from core.trace import trace_from_arrays
from policies import make_policy
from predictors import make_predictor
from predictors.base import Predictor, PredictorCost
from routers import make_router
from routers.power_of_two import STREAM
from simulator.engine import EngineConfig
from simulator.fleet import FleetSimulation
from simulator.profiles.unit import UnitProfile

CONFIG = EngineConfig(max_resident=8, decode_slots=8, prefill_token_budget=256, wait_cap=0)


def _kernels():
    if importlib.util.find_spec("numba") is None:
        return [FleetSimulation]
    from simulator.compiled_fleet import CompiledFleet
    return [FleetSimulation, CompiledFleet]


def _both(trace, arrival, router: str, replicas: int, make_pred, policy: str = "fcfs", config=CONFIG,
          charge_cost: bool = False, seed: int = 0):
    """The run on each kernel; they must agree byte for byte (routing and finish times)."""
    results = [cls(trace, np.asarray(arrival, dtype=np.float64), replicas=replicas, router=make_router(router),
                   make_policy=lambda: make_policy(policy), make_predictor=make_pred, profile=UnitProfile(),
                   config=config, charge_cost=charge_cost, seed=seed).run() for cls in _kernels()]
    for other in results[1:]:
        assert other.replica.tolist() == results[0].replica.tolist()
        assert other.finish_s.tobytes() == results[0].finish_s.tobytes()
    return results[0]


@pytest.mark.parametrize("router", ["least-work", "oracle-work"])
def test_work_is_the_estimate_less_the_tokens_generated(router):
    """Rows (length, arrival): (20, 0), (1, 0), (15, 10), (5, 11); the unit engine (each step 1.0,
    a prompt prefilled in one step that emits its first token). Row 0 -> replica 0 (tie), row 1 ->
    1 (work [20, 0]; it finishes at t = 1). At t = 10 row 0 has 10 tokens: [10, 0] -> row 2 to 1.
    At t = 11 row 0 has 11 (9 to go), row 2 one (14 to go): [9, 14] -> row 3 to 0. On the total
    estimates ([20, 15]) it would go to 1. Finishes: 20, 1, 11 + 14 = 25, 12 + 4 = 16."""
    trace = trace_from_arrays("toy", np.full(4, 4), np.array([20, 1, 15, 5]))
    result = _both(trace, [0, 0, 10, 11], router, 2, lambda: make_predictor("oracle"))
    assert result.replica.tolist() == [0, 1, 1, 0]
    assert result.finish_s.tolist() == [20.0, 1.0, 25.0, 16.0]


def test_power_of_two_tie_goes_to_the_lower_drawn_replica():
    """30 requests at t = 0 (nothing finishes between routings): each pair drawn from the router's
    stream, the one with fewer requests routed so far, the lower index on a tie (the first pairs
    all tie at 0)."""
    n, replicas, seed = 30, 4, 7
    trace = trace_from_arrays("toy", np.full(n, 4), np.full(n, 50))
    result = _both(trace, np.zeros(n), "power-of-two", replicas, lambda: None, seed=seed)
    rng, counts, expected = np.random.default_rng([seed, STREAM]), [0] * replicas, []
    for _ in range(n):
        a, b = sorted(int(x) for x in rng.choice(replicas, size=2, replace=False))
        pick = b if counts[b] < counts[a] else a
        counts[pick] += 1
        expected.append(pick)
    assert result.replica.tolist() == expected


@pytest.mark.parametrize("router", ["least-requests", "least-work", "power-of-two"])
def test_steps_ending_at_an_arrival_land_before_it_is_routed(router):
    """Staggered integer arrivals on the unit engine: steps end exactly at arrival instants. A
    request finishing at t is not outstanding for an arrival at t (checked by hand on the first
    rows), and both kernels route alike throughout."""
    rng = np.random.default_rng(11)
    n = 40
    lengths = rng.integers(1, 7, n)
    lengths[:3] = [2, 1, 3]
    arrival = np.concatenate([[0, 0, 2], 2 + np.cumsum(rng.integers(0, 3, n - 3))])
    trace = trace_from_arrays("toy", np.full(n, 4), lengths)
    config = EngineConfig(max_resident=3, decode_slots=2, prefill_token_budget=64, wait_cap=0)
    result = _both(trace, arrival, router, 2, lambda: make_predictor("oracle"), config=config)
    if router != "power-of-two":
        # row 0 (2 tokens) -> 0, row 1 (1 token) -> 1; at t = 2 both have finished (row 0 at 2,
        # row 1 at 1): row 2 ties at nothing outstanding -> 0 (it would see [1, 0] -> 1 otherwise)
        assert result.finish_s[:2].tolist() == [2.0, 1.0]
        assert result.replica[:3].tolist() == [0, 1, 0]


class LateEstimate(Predictor):
    """A prefill-stage toy: the true length, ready 1.25 s after its prefill step starts (half the
    step to the tapped layer, then 0.75 s of CPU), so after a 1.0 s step has ended."""

    name = "late-estimate"
    stage = "prefill"
    sees_true_lengths = True

    def predict(self, rows, known=None):
        return self.workload.output_tokens[rows].astype(np.float64)

    def cost(self, hardware=None) -> PredictorCost:
        return PredictorCost(tap_fraction=0.5, cpu_s_per_prediction=0.75)


def test_an_estimate_ready_at_an_arrival_comes_after_its_routing():
    """Rows 0 (30 tokens) and 1 (10) at t = 0 go to replicas 0 and 1 (work [prior, 0]); both
    prefill in [0, 1], their estimates are ready at 0 + 0.5 + 0.75 = 1.25, while each replica's
    next step runs [1, 2]. Row 2 arrives at 1.25: the router reads the prior for both ([prior - 1,
    prior - 1]: a tie -> replica 0); were the estimates in first it would read [29, 9] -> 1."""
    trace = trace_from_arrays("toy", np.full(3, 4), np.array([30, 10, 5]), max_tokens=40)
    result = _both(trace, [0.0, 0.0, 0.5 + 0.75], "least-work", 2, LateEstimate, policy="fcfs",
                   charge_cost=True)
    assert result.replica.tolist() == [0, 1, 0]
    assert result.predicted_ready_s.tolist() == [1.25, 1.25, 3.25]
