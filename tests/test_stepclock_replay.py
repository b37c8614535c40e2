"""CI's hold on decision-level equality (issue 20, docs/semantics.md "Step clock"): every committed
step-clocked serving run under traces/live/ (``*-steps-*.parquet``, found by glob so that new runs
are covered without editing) is replayed by the simulator alone (no vLLM) and every request's
finish step must equal the live one: all of them for FCFS and oracle countdown, at least 99% for
leap and leap-rls (their estimates come from the live engine's float hidden states); runs with a
bound KV cache (``-kvN-``, ``leap-serve --kv-blocks``) hold each request's preemptions the same way,
runs with vLLM's prefix caching on (``-kvN-prefix-``, ``leap-serve --prefix-caching on``) each
request's cached tokens (vLLM's hit at its first admission), and every run its requests' admit and
first-token steps to the same share. Among them are runs of
policies beyond countdown (``HELD``): prediction-free ``mlfq`` and the tail-keeping LEAP policy
``slack-mlfq`` on leap-rls, whose clock (its requests' deadlines) is the tick under the step clock.

The live fleets under traces/live/fleet/ (``*-r*-*.parquet``: two engines in one process, docs/
semantics.md "Live fleets") are replayed with ``--replicas 2 --router NAME``: every request's
replica too, and for FCFS and the oracle its admit and first-token step as well.

No step-clocked run or fleet found is a failure, not a skip: the runs are part of the repository."""

from __future__ import annotations

import pytest

from core.trace import load_trace, traces_dir
from experiments.serving_runs import SIDE_TABLE_SUFFIXES
from experiments.validate_steps import TARGETS, validate_step_run
from simulator.stepclock import trace_clock

LIVE = traces_dir() / "live"
SINGLE = sorted(p for p in LIVE.glob("*-steps-*.parquet") if not p.name.endswith(SIDE_TABLE_SUFFIXES))
FLEETS = sorted(p for p in (LIVE / "fleet").glob("*-r*-*.parquet") if not p.name.endswith(SIDE_TABLE_SUFFIXES))
RUNS = SINGLE + FLEETS
#: step-clocked sets that must stay committed: policies that key on prompts, attained service and the clock
HELD = ("alpaca40-steps-mlfq-1.3", "alpaca40-steps-slack-mlfq-1.3",
        "sharegpt-turns60-steps-kv128-prefix-fcfs-1.3",   # multi-turn prompts, vLLM's prefix cache on
        "sharegpt-turns60-steps-kv128-prefix-oracle-1.3")


@pytest.mark.parametrize("runs", [SINGLE, FLEETS], ids=["single", "fleet"])
def test_step_clocked_runs_are_committed(runs):
    assert runs, (f"no step-clocked serving run under {LIVE.name}/: record them with leap-serve --clock steps "
                  "(fleets: scripts/live_fleet_runs.sh)")


@pytest.mark.parametrize("name", HELD)
def test_held_policy_sets_are_committed(name):
    assert name in {p.stem for p in SINGLE}, (f"{name}.parquet missing under {LIVE.name}/: record it with "
                                              "scripts/live_steps_runs.sh (header: the small sets)")


@pytest.mark.parametrize("path", RUNS, ids=[p.stem for p in RUNS])
def test_replay_finishes_every_request_at_the_live_step(path):
    trace = load_trace(path)
    assert trace_clock(trace) == "steps", f"{path.name} is named like a step-clocked run but serving.clock is not 'steps'"
    row = validate_step_run(trace)
    target = TARGETS[row["predictor"]]
    shown = row["finish_step_mismatches"][:10]
    assert row["finish_step_match_share"] >= target, (
        f"{path.name}: {row['finish_step_match_share']:.2%} of finish steps equal (target {target:.0%}); "
        f"first divergence at step {row['first_divergence_step']}; mismatches {shown}")
    if "preemptions_match_share" in row:   # a bound KV cache (leap-serve --kv-blocks): preemptions too
        assert row["preemptions_match_share"] >= target, (
            f"{path.name}: {row['preemptions_match_share']:.2%} of preemption counts equal (target {target:.0%}); "
            f"live {row['preemptions_live']}, simulated {row['preemptions_sim']}")
    if "cached_tokens" in trace.table.column_names:   # vLLM's prefix caching on: every request's hit
        assert row["cached_tokens_match_share"] >= target, (
            f"{path.name}: {row['cached_tokens_match_share']:.2%} of cached-token counts equal (target {target:.0%}); "
            f"live {row['cached_tokens_live']}, simulated {row['cached_tokens_sim']}")
    for field in ("admit_step", "first_token_step"):
        assert row[f"{field}_match_share"] >= target, (
            f"{path.name}: {row[f'{field}_match_share']:.2%} of {field}s equal (target {target:.0%}); "
            f"first divergence at step {row['first_divergence_step']}")
    if path in FLEETS:
        assert row["replica_match_share"] >= target, f"{path.name}: {row['replica_match_share']:.2%} of replicas equal"
