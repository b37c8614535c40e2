"""A serving run set up for the simulator: its workload at the client's send times, the step profile
fitted on another run's steps (plus its busy host gap), the host-speed ratio between two runs, and
the replay of each run segment from an empty engine (:func:`simulate_segments`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from core.trace import Trace
from simulator.runner import NO_PREDICTOR
from simulator.serving import serving_meta as _serving
from simulator.serving import source_rows


def serving_workload(trace: Trace, source: Trace, rows: np.ndarray | None = None) -> Trace:
    """The simulated workload of (some rows of) a serving run: the served requests at the client's
    send times, with prompt tokens and served (forced) lengths, joined by request_id with the source
    trace's rows for every feature column.

    The recorder hands a request to the engine only between steps, so its ``arrival_s`` trails the
    planned send time by up to a step, and its ``ttft_s``/``e2e_s`` count from that hand-off. The
    simulator's steps do not fall where the real ones did, so replayed at the hand-off times its
    requests would wait for a step the real ones never waited for (half a step on average, about
    50 ms of TTFT in the alpaca200 runs). Both are therefore counted from the send time
    (``planned_arrival_s``): the replay submits there, and the measured latencies get the hand-off
    wait added (a client's view of the real engine). Runs without planned times keep ``arrival_s``."""
    import pyarrow as pa

    from core.trace import FEATURE_COLUMNS, trace_content_hash

    served = trace.table if rows is None else trace.table.take(pa.array(np.asarray(rows, dtype=np.int64)))
    ids = served.column("request_id").to_pylist()
    src_rows = source_rows(trace, source, ids)
    src_prompt = source.prompt_tokens[src_rows]
    prompt = served.column("prompt_tokens").to_numpy().astype(np.int64)
    if not np.array_equal(src_prompt, prompt):
        i = int(np.flatnonzero(src_prompt != prompt)[0])
        raise ValueError(f"trace {trace.name!r}: request {ids[i]!r} has {prompt[i]} prompt tokens, its source "
                         f"{source.name!r} {src_prompt[i]}")
    columns = {name: served.column(name) for name in
               ("request_id", "domain", "prompt_id", "prompt_tokens", "output_tokens", "finish_reason",
                "max_tokens", "arrival_s", "ttft_s", "e2e_s")}
    picked = source.table.take(pa.array(src_rows))
    for name in FEATURE_COLUMNS:
        if name in source.table.column_names:
            columns[name] = picked.column(name)
    if "planned_arrival_s" in served.column_names:
        planned = served.column("planned_arrival_s").to_numpy(zero_copy_only=False).astype(np.float64)
        handed = served.column("arrival_s").to_numpy(zero_copy_only=False).astype(np.float64)
        if np.isfinite(planned).all():
            wait = np.maximum(handed - planned, 0.0)
            columns["arrival_s"] = pa.array(planned, pa.float64())
            for name in ("ttft_s", "e2e_s"):
                columns[name] = pa.array(columns[name].to_numpy(zero_copy_only=False).astype(np.float64) + wait,
                                         pa.float64())
    table = pa.table(columns)
    meta = {**source.metadata, "serving": _serving(trace)}
    return Trace(name=trace.name, path=None, table=table, metadata=meta,
                 content_hash=trace_content_hash(table, meta))


def busy_host_gaps(steps, table) -> np.ndarray:
    """Per step of a serving run's steps table: the time from its end to the next step's start in
    the same run segment while requests were in the engine (NaN where the engine was idle, waiting
    for the next arrival, and at a segment's last step). This is the host's share of a step the
    worker's ``step_s`` leaves out: vLLM's scheduling (the live scheduler's ordering included),
    output processing, request submission and the drift probe."""
    n = steps.num_rows
    wall = steps.column("wall_start_s").to_numpy(zero_copy_only=False).astype(np.float64)
    dur = steps.column("step_s").to_numpy(zero_copy_only=False).astype(np.float64)
    run = (steps.column("run").to_numpy(zero_copy_only=False).astype(np.int64)
           if "run" in steps.column_names else np.zeros(n, dtype=np.int64))
    req_run = (table.column("run").to_numpy(zero_copy_only=False).astype(np.int64)
               if "run" in table.column_names else np.zeros(table.num_rows, dtype=np.int64))
    arrival = table.column("arrival_s").to_numpy(zero_copy_only=False).astype(np.float64)
    finish = arrival + table.column("e2e_s").to_numpy(zero_copy_only=False).astype(np.float64)
    gaps = np.full(n, np.nan)
    for k in np.unique(run):
        idx = np.flatnonzero(run == k)
        idx = idx[np.argsort(wall[idx], kind="stable")]
        mine = req_run == k
        arr, fin = np.sort(arrival[mine]), np.sort(finish[mine])
        end = wall[idx[:-1]] + dur[idx[:-1]]
        nxt = wall[idx[1:]]
        in_flight = np.searchsorted(arr, end, side="right") - np.searchsorted(fin, nxt, side="right")
        g = nxt - end
        gaps[idx[:-1]] = np.where(in_flight > 0, g, np.nan)
    return gaps


def serving_profile(profile_from: Trace):
    """Step profile fitted on a serving run's steps: the fitted profile's model (per clean run,
    drifting runs dropped) plus the mean busy host gap (:func:`busy_host_gaps`) as its host gap."""
    import pyarrow as pa

    from simulator.profiles.fitted import FittedProfile

    steps = profile_from.steps
    if steps is None:
        raise ValueError(f"trace {profile_from.name!r} has no steps table to fit a profile on")
    if "host_gap_s" not in steps.column_names and "wall_start_s" in steps.column_names \
            and "arrival_s" in profile_from.table.column_names and "e2e_s" in profile_from.table.column_names:
        steps = steps.append_column("host_gap_s", pa.array(busy_host_gaps(steps, profile_from.table), pa.float64()))
    return FittedProfile.fit(steps, source=profile_from.name,
                             note=f"fitted on serving run {profile_from.name}'s steps (+ busy host gap)")


def simulate_segments(workload: Trace, segment: np.ndarray, policy_name: str, predictor_name: str, train: str,
                       profile, config, charge_cost: bool, update_every: int) -> dict:
    """Replay each run segment on its own (a resumed run restarted with an empty engine), requests at
    their offsets in the workload (the client's send times); per-request results back in the workload's
    row order."""
    from policies import make_policy
    from predictors import make_predictor
    from predictors.base import PredictorOptions
    from simulator.compiled import DEFAULT_KERNEL
    from simulator.engine import Simulation
    from simulator.runner import run_simulation

    n = len(workload)
    seg = np.asarray(segment, dtype=np.int64)
    e2e, ttft = np.full(n, np.nan), np.full(n, np.nan)
    first_pred = np.full(n, np.nan)
    out: dict[str, Any] = {"makespan_s": 0.0, "gpu_s_charged": 0.0, "predictor_cpu_s": 0.0, "steps": 0}
    sent = workload.arrival_s
    if sent is None:
        raise ValueError(f"trace {workload.name!r}: no arrival_s to replay")
    # the compiled kernel where the profile has a compiled form (one scaled at a run's speed has none)
    kernel = DEFAULT_KERNEL if profile.compiled_coefficients() is not None else "reference"
    for k in np.unique(seg):
        rows = np.flatnonzero(seg == k)
        part = workload.take(rows)
        arrival = sent[rows] - float(sent[rows].min())
        predictor = None
        if predictor_name != NO_PREDICTOR:
            predictor = make_predictor(predictor_name, PredictorOptions(train_trace=train, update_every=update_every))
        sim = Simulation(part, arrival, policy=make_policy(policy_name), predictor=predictor, profile=profile,
                         config=config, seed=0, charge_cost=charge_cost)
        result = run_simulation(sim, kernel)
        row_of = {rid: i for i, rid in enumerate(result.rows_request_id.tolist())}
        order = np.array([row_of[rid] for rid in part.request_id.tolist()], dtype=np.int64)
        e2e[rows] = (result.finish_s - result.arrival_s)[order]
        ttft[rows] = (result.first_token_s - result.arrival_s)[order]
        first_pred[rows] = result.predicted_tokens[order]
        out["makespan_s"] += result.makespan_s
        out["gpu_s_charged"] += result.gpu_s_charged
        out["predictor_cpu_s"] += result.predictor_cpu_s
        out["steps"] += result.steps
    out.update(e2e=e2e, ttft=ttft, predicted=first_pred)
    return out


class AtRunSpeed:
    """A fitted serving profile with its step times (host gap apart) scaled by a run's own measured
    speed ratio (:func:`step_time_ratio`). A diagnostic, not a validation (one scalar fitted on the
    run itself): what is left of a replay's error once the host's speed is taken out."""

    name = "fitted-at-run-speed"

    def __init__(self, profile, ratio: float):
        self.profile, self.ratio = profile, float(ratio)
        self.host_gap_s = profile.host_gap_s
        self.hardware = profile.hardware

    def step_time(self, prefill_tokens, prefill_sq, decode_batch, decode_context) -> float:
        t = self.profile.step_time(prefill_tokens, prefill_sq, decode_batch, decode_context)
        return (t - self.host_gap_s) * self.ratio + self.host_gap_s

    def compiled_coefficients(self) -> None:
        """None: the scaling is no formula the compiled kernel knows (its replays run on the reference)."""
        return None

    def describe(self) -> dict:
        return {**self.profile.describe(), "scaled_by_run_speed": self.ratio}


def step_time_ratio(trace: Trace, profile, q: float = 50.0) -> float | None:
    """Median (or the ``q``-th percentile) over the run's recorded steps of measured ``step_s`` / the
    profile's step time for the same composition (host gap left out): how fast the host ran this run
    relative to the profile run."""
    steps = trace.steps
    if steps is None:
        return None
    cols = {}
    for name in ("prefill_tokens", "prefill_sq", "decode_requests", "decode_context"):
        cols[name] = (steps.column(name).to_numpy(zero_copy_only=False).astype(np.float64)
                      if name in steps.column_names else np.zeros(steps.num_rows))
    measured_s = steps.column("step_s").to_numpy(zero_copy_only=False).astype(np.float64)
    predicted = np.array([profile.step_time(a, b, c, d) for a, b, c, d in zip(
        cols["prefill_tokens"], cols["prefill_sq"], cols["decode_requests"], cols["decode_context"])])
    predicted -= getattr(profile, "host_gap_s", 0.0)
    ok = predicted > 0
    return float(np.percentile(measured_s[ok] / predicted[ok], q)) if ok.any() else None
