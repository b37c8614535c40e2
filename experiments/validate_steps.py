"""Step-clocked serving runs (``leap-serve --clock steps``) against their replay, request by request.

Each run is replayed as ``simulate --trace RUN --arrivals steps --preset recorded`` would: the live
run's policy and predictor (LEAP with the read-out's own training trace, RLS with the live update
batch), its scheduler's caps, every request at its ``arrival_step``, unit-time steps, nothing
charged (docs/semantics.md, "Step clock"). The check is exact: the share of requests whose simulated
``finish_step`` equals the measured one, with every mismatch listed (request id, live and simulated
finish step) for diagnosis. Targets: 100% for FCFS and the oracle, >= 99% for leap and leap-rls.
"""

from __future__ import annotations

import numpy as np

from core.trace import Trace
from experiments import live_replay
from predictors.base import PredictorOptions
from routers import DEFAULT_ROUTER
from simulator.compiled import DEFAULT_KERNEL
from simulator.engine import RunResult
from simulator.fleet import FleetSimulation
from simulator.runner import RunConfig, execute, prepare
from simulator.serving import serving_meta
from simulator.stepclock import step_column, trace_clock
from simulator.workload import ArrivalSpec

#: share of equal finish steps each live predictor must reach (hidden-state estimates are floats)
TARGETS = {"none": 1.0, "oracle": 1.0, "leap": 0.99, "leap-rls": 0.99}
STEP_FIELDS = ("admit_step", "first_token_step", "finish_step")


def readout_train_trace(trace: Trace) -> str:
    """The training trace of the LEAP read-out the live run used (:func:`experiments.live_replay.readout_file`):
    the simulator's LEAP is fitted on the same trace, so both score a request with the same weights."""
    path, why = live_replay.readout_file(trace)
    if path is None:
        raise ValueError(f"trace {trace.name!r}: a LEAP run whose read-out cannot be used: {why}")
    train = live_replay.readout_contents(path)[0].get("train_name")
    if not train:
        raise ValueError(f"trace {trace.name!r}: read-out {path.name} does not name its training trace")
    return str(train)


def step_replay_config(trace: Trace, kernel: str = DEFAULT_KERNEL) -> RunConfig:
    """The ``simulate`` run that replays a step-clocked serving run as it ran."""
    if trace_clock(trace) != "steps":
        raise ValueError(f"trace {trace.name!r} is not a step-clocked serving run (serving.clock)")
    s = serving_meta(trace)
    _, predictor = live_replay.simulator_twin(trace, TARGETS, "step-clock replay")
    train = readout_train_trace(trace) if predictor in live_replay.READOUT_PREDICTORS else "lmsys"
    options = PredictorOptions(train_trace=train, update_every=live_replay.update_every(trace))
    if trace.path is None:
        raise ValueError(f"trace {trace.name!r}: a step-clocked run is replayed from its file")
    replicas, router = int(s.get("replicas", 1)), str(s.get("router", DEFAULT_ROUTER))
    return RunConfig(trace=str(trace.path), predictor=predictor, policy=str(s.get("policy", "fcfs")),
                     engine="unit", load=None, arrivals=ArrivalSpec("steps"), preset="recorded",
                     predictor_options=options, charge_cost=False, kernel=kernel, replicas=replicas,
                     router=router)


def replay_steps(trace: Trace, kernel: str = DEFAULT_KERNEL) -> RunResult:
    """The run replayed by the simulator (refused when the live run ordered admission and the
    simulator would not, or the other way round)."""
    prepared = prepare(step_replay_config(trace, kernel))
    sim = prepared.simulation
    if isinstance(sim, FleetSimulation):   # a live fleet: every replica runs the same policy and predictor
        predictor, policy = (sim.predictors[0] if sim.predictors else None), sim.make_policy()
    else:
        predictor, policy = sim.predictor, sim.policy
    sim_orders = predictor is not None and predictor.stage == "arrival" and policy.uses_predictions
    live_replay.check_admission_order(trace, sim_orders, "the step-clock replay")
    _, result = execute(prepared)
    return result


def compare_steps(trace: Trace, result: RunResult) -> dict:
    """Measured vs simulated step columns, joined by request id: the share of equal values per column
    and every finish-step mismatch (request id, live, simulated, and the live/sim admit steps)."""
    ids = trace.table.column("request_id").to_pylist()
    row_of = {rid: i for i, rid in enumerate(result.rows_request_id.tolist())}
    missing = [rid for rid in ids if rid not in row_of]
    if missing:
        raise ValueError(f"trace {trace.name!r}: request {missing[0]!r} was not replayed")
    order = np.array([row_of[rid] for rid in ids], dtype=np.int64)
    out: dict = {}
    live, sim = {}, {}
    for name in STEP_FIELDS:
        live[name] = step_column(trace, name)
        sim[name] = np.asarray(getattr(result, name))[order]
        out[f"{name}_match_share"] = float(np.mean(live[name] == sim[name])) if len(ids) else 1.0
    bad = np.flatnonzero(live["finish_step"] != sim["finish_step"])
    out["finish_step_mismatches"] = [
        {"request_id": ids[i], "live_finish_step": int(live["finish_step"][i]),
         "sim_finish_step": int(sim["finish_step"][i]), "live_admit_step": int(live["admit_step"][i]),
         "sim_admit_step": int(sim["admit_step"][i])} for i in bad.tolist()]
    out["first_divergence_step"] = _first_divergence(live, sim)
    # a bound KV cache (leap-serve --kv-blocks); vLLM's prefix caching on: each request's hit, vLLM's own
    for column, simulated in (("preemptions", result.preemptions), ("cached_tokens", result.cached_tokens)):
        if column in trace.table.column_names:
            _compare_counts(out, column, trace.table.column(column), simulated, order, bad)
    if "replica" in trace.table.column_names:   # a live fleet: the replica each request was routed to
        live_replica = trace.table.column("replica").to_numpy(zero_copy_only=False).astype(np.int64)
        sim_replica = np.asarray(result.replica)[order]
        out["replica_match_share"] = float(np.mean(live_replica == sim_replica)) if len(ids) else 1.0
    if "predicted_tokens" in trace.table.column_names:   # the live scheduler's first estimate vs the simulator's
        live_est = trace.table.column("predicted_tokens").to_numpy(zero_copy_only=False).astype(np.float64)
        sim_est = np.asarray(result.predicted_tokens, dtype=np.float64)[order]
        ok = np.isfinite(live_est) & np.isfinite(sim_est)
        if ok.any():
            rel = np.abs(live_est[ok] - sim_est[ok]) / np.maximum(np.abs(live_est[ok]), 1e-12)
            out["first_estimate_max_rel_diff"] = float(rel.max())
            out["first_estimate_median_rel_diff"] = float(np.median(rel))
        for m, i in zip(out["finish_step_mismatches"], bad.tolist()):
            m["live_first_estimate"], m["sim_first_estimate"] = _num(live_est[i]), _num(sim_est[i])
    return out


def _compare_counts(out: dict, column: str, live_column, simulated, order: np.ndarray, bad: np.ndarray) -> None:
    """A per-request count the live run recorded (``column``) against the replay's: the share equal, the
    sums, and each finish-step mismatch's pair."""
    live = live_column.to_numpy(zero_copy_only=False).astype(np.int64)
    sim = (np.zeros(len(live), dtype=np.int64) if simulated is None
           else np.asarray(simulated, dtype=np.int64)[order])
    out[f"{column}_match_share"] = float(np.mean(live == sim)) if len(live) else 1.0
    out[f"{column}_live"], out[f"{column}_sim"] = int(live.sum()), int(sim.sum())
    for m, i in zip(out["finish_step_mismatches"], bad.tolist()):
        m[f"live_{column}"], m[f"sim_{column}"] = int(live[i]), int(sim[i])


def _num(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None


def _first_divergence(live: dict, sim: dict) -> int | None:
    """The earliest step at which any request's admit, first-token or finish step differs (the step
    where the two schedules part; everything after it may follow from it)."""
    first = None
    for name in STEP_FIELDS:
        diff = live[name] != sim[name]
        if diff.any():
            at = int(np.minimum(live[name][diff], sim[name][diff]).min())
            first = at if first is None else min(first, at)
    return first


def validate_step_run(trace: Trace, kernel: str = DEFAULT_KERNEL) -> dict:
    """One ``leap-validate`` row of a step-clocked run."""
    s = serving_meta(trace)
    live_pred = s.get("predictor", "none")
    result = replay_steps(trace, kernel)
    row = {"run": trace.name, "clock": "steps", "policy": s.get("policy", "fcfs"), "predictor": live_pred,
           **({"replicas": s["replicas"], "router": s["router"]} if s.get("replicas", 1) > 1 else {}),
           "load": s.get("load"), "capacity_req_per_step": s.get("capacity_req_per_step"),
           "requests": len(trace), "replay": "arrivals at arrival_step, unit-time steps, nothing charged"}
    comparison = compare_steps(trace, result)
    share = comparison.pop("finish_step_match_share")
    row["finish_step_match_share"] = share
    row["finish_step_target"] = TARGETS.get(live_pred)
    row["meets_target"] = live_pred in TARGETS and share >= TARGETS[live_pred]
    row.update(comparison)
    return row


def _replica_cell(row: dict) -> str:
    """A live fleet's replica agreement and router; '-' for one engine."""
    if "replica_match_share" not in row:
        return "-"
    return f"{row['replica_match_share']:.1%} ({row['replicas']} x {row['router']})"


def _share(row: dict, name: str) -> str:
    """A bound cache's per-request agreement (preemptions; cached tokens with vLLM's prefix caching
    on) and the live total; '-' where the run has no such column."""
    if f"{name}_match_share" not in row:
        return "-"
    return f"{row[f'{name}_match_share']:.1%} ({row[f'{name}_live']})"


def step_runs_section(rows: list[dict]) -> str:
    """Markdown table of step-clocked rows (``leap-validate`` without ``--json``)."""
    lines = ["## Step-clocked serving runs: finish step, live vs simulated\n",
             "| run | policy | predictor | load | requests | finish step equal | target | admit equal "
             "| first token equal | first divergence step | replica equal (router) | preemptions equal "
             "| cached tokens equal (live sum) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        first = r.get("first_divergence_step")
        lines.append(f"| {r['run']} | {r['policy']} | {r['predictor']} | {r['load']} | {r['requests']} | "
                     f"{r['finish_step_match_share']:.1%} | {r['finish_step_target']:.0%} | "
                     f"{r['admit_step_match_share']:.1%} | {r['first_token_step_match_share']:.1%} | "
                     f"{'-' if first is None else first} | {_replica_cell(r)} | {_share(r, 'preemptions')} | "
                     f"{_share(r, 'cached_tokens')} |")
    return "\n".join(lines) + "\n"
