"""Validation of serving runs (``leap-serve``, ``traces/live/``): each run replayed by the simulator
with the live run's own policy, predictor and engine settings, every request at its recorded
submission time and forced length, under a step profile fitted on ANOTHER serving run's steps;
measured against simulated latency, and the measured gain of each policy over FCFS against the
simulated one (``leap-validate`` prints both: :mod:`experiments.validate`).
"""

from __future__ import annotations

import json

import numpy as np

from core.trace import Trace, load_trace
from experiments.replay_errors import replay_errors
from simulator.runner import NO_PREDICTOR
from simulator.serving import GIVEN_SOURCES, is_serving, serving_engine_config, source_rows, source_trace
from simulator.serving import serving_meta as _serving
from simulator.stepclock import trace_clock

__all__ = ["GIVEN_SOURCES", "is_serving", "serving_engine_config", "source_trace"]   # moved to simulator.serving; imported from here too


def _pct(x: np.ndarray, q: float) -> float:
    return float(np.percentile(x, q)) if len(x) else float("nan")


def measured(trace: Trace) -> dict[str, np.ndarray]:
    e2e = trace.table.column("e2e_s").to_numpy(zero_copy_only=False).astype(np.float64)
    ttft = trace.table.column("ttft_s").to_numpy(zero_copy_only=False).astype(np.float64)
    if not (np.isfinite(e2e).all() and np.isfinite(ttft).all()):
        raise ValueError(f"trace {trace.name!r}: e2e_s/ttft_s missing; nothing measured to validate against")
    return {"e2e": e2e, "ttft": ttft}


def _figures(prefix: str, e2e, ttft, out_tok, makespan) -> dict:
    multi = out_tok > 1
    return {f"{prefix}_mean_e2e_s": float(e2e.mean()), f"{prefix}_p50_e2e_s": _pct(e2e, 50),
            f"{prefix}_p95_e2e_s": _pct(e2e, 95), f"{prefix}_p99_e2e_s": _pct(e2e, 99),
            f"{prefix}_mean_ttft_s": float(ttft.mean()), f"{prefix}_p95_ttft_s": _pct(ttft, 95),
            f"{prefix}_mean_tpot_s": float(((e2e - ttft)[multi] / (out_tok[multi] - 1)).mean()),
            f"{prefix}_mean_ptl_s": float((e2e / out_tok).mean()), f"{prefix}_makespan_s": float(makespan)}



#: The drift probe (a fixed 2 x 192^3 fp32 matmul timed on the engine's thread every few steps)
#: slows by the share of the core other processes take. A run is flagged ``contended`` when its
#: median probe time exceeds the quiet reference taken before the run by more than this factor:
#: the same factor at which the fitted profile calls a run contended and drops it
#: (simulator.profiles.fitted.DRIFT_FACTOR), so the two criteria agree.
CONTENDED_PROBE_RATIO = 1.5
#: ... or when its 90th percentile exceeds the quiet reference by more than this factor: for over a
#: tenth of the run the core ran at less than half speed (intermittent contention that leaves the
#: median alone). A percentile, not the coefficient of variation: single preempted probes (one at
#: 50x) blow the CV up on an otherwise quiet run.
CONTENDED_PROBE_P90_RATIO = 2.0
#: ... or when the memory probe's median (a sum over 64 MiB, beyond the L3: the DRAM bandwidth the
#: model's weight streaming needs, which the in-cache matmul probe does not see) exceeds its quiet
#: reference by more than this factor. 1.5: on the alpaca200 runs recorded with nothing else on the
#: machine the ratio was 1.23-1.30 (the probe follows a forward on the same core, the reference is
#: taken on an idle engine), so 1.25 flagged quiet runs; runs recorded beside other work read the
#: same 1.23-1.28, so this probe does not separate them either: see ``step_time_ratio``.
CONTENDED_MEM_PROBE_RATIO = 1.5
#: A run whose steps ran more than this factor off the profile run's (either way, median over its
#: steps of measured / profile-predicted step time, same step compositions) is flagged
#: ``host_mismatch``: the two runs ran on a differently loaded host. Reported, never corrected for.
#: The drift probe cannot see this: it is a cache-resident matmul, while a forward of the model
#: streams its weights from memory, so a neighbour core's memory traffic slows steps and not the
#: probe (alpaca40 runs: steps at 0.5x to 1.2x of each other with equal probe medians). 10%: a run
#: that far off cannot meet 3-5% error targets whatever the simulator does.
HOST_MISMATCH_FACTOR = 1.10
PREDICTOR_COSTS = ("none", "charged")
SIDE_TABLE_SUFFIXES = (".steps.parquet", ".sched.parquet", ".decode.parquet")
#: live predictor name -> simulator predictor name (identical by construction)
LIVE_PREDICTORS = {"none": NO_PREDICTOR, "oracle": "oracle", "leap": "leap", "leap-rls": "leap-rls", "ssjf": "ssjf"}


def serving_workload_key(trace: Trace) -> str:
    """Runs of the same workload on the same engine setting share this key (the live capacity's
    cache key: source requests, forced lengths, caps, token budget, threads; not the policy)."""
    s = _serving(trace)
    key = s.get("capacity_key")
    if key:
        return str(key)
    src = s.get("source_trace") or {}
    return json.dumps([src.get("sha256"), src.get("rows"), s.get("max_length"), s.get("forced_lengths"),
                       s.get("max_resident"), s.get("decode_slots"), s.get("wait_cap"),
                       s.get("max_num_batched_tokens")], sort_keys=True)


def serving_load(trace: Trace) -> float | None:
    s = _serving(trace)
    value = s.get("load")
    return float(value) if isinstance(value, (int, float)) else None


def _same_load(a: Trace, b: Trace) -> bool:
    la, lb = serving_load(a), serving_load(b)
    if la is not None and lb is not None:
        return abs(la - lb) < 1e-9
    ra, rb = _serving(a).get("rate_req_s"), _serving(b).get("rate_req_s")
    return la is None and lb is None and isinstance(ra, (int, float)) and isinstance(rb, (int, float)) \
        and abs(ra - rb) <= 1e-9 * max(abs(ra), 1.0)


def same_run(a: Trace, b: Trace) -> bool:
    """One and the same run (the same object, or the same file)."""
    if a is b:
        return True
    return a.path is not None and b.path is not None and a.path.resolve() == b.path.resolve()


def is_fcfs_run(trace: Trace) -> bool:
    s = _serving(trace)
    return s.get("policy") == "fcfs" and s.get("predictor", "none") == "none"


def fcfs_partner(trace: Trace, candidates: list[Trace], chosen: Trace | None = None) -> Trace | None:
    """The FCFS run of the same workload at the same load, among ``candidates`` (None if absent);
    ``chosen`` (``leap-validate --reference RUN``) is taken first when it is such a run."""
    key = serving_workload_key(trace)
    for c in ([chosen] if chosen is not None else []) + list(candidates):
        if not same_run(c, trace) and is_serving(c) and is_fcfs_run(c) and serving_workload_key(c) == key \
                and _same_load(c, trace):
            return c
    return None


def default_profile_source(trace: Trace, candidates: list[Trace]) -> Trace:
    """The serving run whose steps the profile is fitted on: another run of the same workload at
    the same load, the FCFS one first (so its steps cover the same range of batch sizes: a profile
    fitted at another load extrapolates, e.g. from mostly-full 16-decode steps at 1.3x to the
    4-8-decode steps of 0.8x); else a run at another load, FCFS first. Never the run itself."""
    key = serving_workload_key(trace)
    others = [c for c in candidates if is_serving(c) and not same_run(c, trace) and c.steps is not None
              and serving_workload_key(c) == key]
    ranked = sorted(others, key=lambda c: (not _same_load(c, trace), not is_fcfs_run(c), c.name))
    if not ranked:
        raise ValueError(f"trace {trace.name!r}: no other serving run of the same workload (with a steps "
                         "table) to fit the step profile on; give one with --profile-from")
    return ranked[0]


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


def _readout_check(trace: Trace) -> tuple[str, str]:
    """(training trace of the live read-out, note): the read-out file named in serving.readout is
    looked up beside the trace; its lambda and weights are compared with the simulator's LEAP fit
    on the same training trace (predictors.leap.fit_readout, the function live.readout exports)."""
    import hashlib

    from core.readout import DEFAULT_TARGET, fit_readout

    ref = _serving(trace).get("readout")
    if not ref:
        return "lmsys", "no read-out named in the serving metadata; simulator's leap trained on lmsys"
    fname, _, digest = str(ref).partition("@sha256:")
    path = trace.path.parent / fname if trace.path is not None else None
    if path is None or not path.is_file():
        return "lmsys", f"read-out {fname} not found beside the trace; simulator's leap trained on lmsys (assumed)"
    if hashlib.sha256(path.read_bytes()).hexdigest()[:len(digest)] != digest:
        return "lmsys", f"read-out {fname} beside the trace is not the one the run used (hash); assumed lmsys"
    with np.load(path, allow_pickle=False) as data:
        info = json.loads(str(data["info"]))
        theta = np.array(data["theta"], dtype=np.float64)
    train = info.get("train_name") or "lmsys"
    sim, _ = fit_readout(load_trace(train), info.get("column", "feat_last"), info.get("target", DEFAULT_TARGET))
    rel = float(np.max(np.abs(sim.theta - theta)) / max(np.max(np.abs(theta)), 1e-300))
    same = abs(sim.lam - float(info["lam"])) <= 1e-9 * abs(float(info["lam"])) and rel < 1e-9
    note = (f"same fit as the live read-out (trained on {train}, lambda {sim.lam:.4g}, weights within {rel:.1e})"
            if same else f"DIFFERS from the live read-out: lambda {sim.lam:.6g} vs {info['lam']:.6g}, weights rel. {rel:.2e}")
    return train, note


def _simulate_segments(workload: Trace, segment: np.ndarray, policy_name: str, predictor_name: str, train: str,
                       profile, config, charge_cost: bool, update_every: int) -> dict:
    """Replay each run segment on its own (a resumed run restarted with an empty engine), requests at
    their offsets in the workload (the client's send times); per-request results back in the workload's
    row order."""
    from policies import make_policy
    from predictors import make_predictor
    from predictors.base import PredictorOptions
    from simulator.engine import Simulation

    n = len(workload)
    seg = np.asarray(segment, dtype=np.int64)
    e2e, ttft = np.full(n, np.nan), np.full(n, np.nan)
    first_pred = np.full(n, np.nan)
    out = {"makespan_s": 0.0, "gpu_s_charged": 0.0, "predictor_cpu_s": 0.0, "steps": 0}
    for k in np.unique(seg):
        rows = np.flatnonzero(seg == k)
        part = workload.take(rows)
        arrival = part.arrival_s - float(part.arrival_s.min())
        predictor = None
        if predictor_name != NO_PREDICTOR:
            predictor = make_predictor(predictor_name, PredictorOptions(train_trace=train, update_every=update_every))
        sim = Simulation(part, arrival, policy=make_policy(policy_name), predictor=predictor, profile=profile,
                         config=config, seed=0, charge_cost=charge_cost)
        result = sim.run()
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


def live_prediction_cost(trace: Trace) -> dict:
    """The live scheduler's own cost per step (NAME.sched.parquet): ordering (``order_s``, on the
    scheduler's thread) and the hook's read-out (``predict_s``, inside the forward), as a share of the
    scheduler's step (``step_s``: schedule() start to update_from_output() end)."""
    import pyarrow.parquet as pq

    from core.trace import side_table_path

    if trace.path is None or not side_table_path(trace.path, "sched").is_file():
        return {}
    t = pq.read_table(side_table_path(trace.path, "sched"))
    need = ("order_s", "predict_s", "step_s")
    if any(c not in t.column_names for c in need):
        return {}
    order, pred, step = (t.column(c).to_numpy(zero_copy_only=False).astype(np.float64) for c in need)
    ok = np.isfinite(order) & np.isfinite(pred) & np.isfinite(step) & (step > 0)
    if not ok.any():
        return {}
    order, pred, step = order[ok], pred[ok], step[ok]
    return {"live_order_s": float(order.sum()), "live_predict_s": float(pred.sum()),
            "live_step_s": float(step.sum()), "live_steps": int(ok.sum()),
            "live_cost_share_median": float(np.median((order + pred) / step)),
            "live_cost_share_run": float((order + pred).sum() / step.sum()),
            "live_predict_share_run": float(pred.sum() / step.sum()),
            "live_order_share_run": float(order.sum() / step.sum())}


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


def probe_summary(trace: Trace) -> dict:
    """The drift probe's figures and the ``contended`` flag (see :data:`CONTENDED_PROBE_RATIO`)."""
    probe = _serving(trace).get("probe") or {}
    ratio, cv = probe.get("median_over_before_run"), probe.get("cv")
    before, p90 = probe.get("before_run_median_s"), probe.get("p90_s")
    p90_ratio = float(p90 / before) if isinstance(p90, (int, float)) and isinstance(before, (int, float)) \
        and before > 0 else None
    mem_ratio = (probe.get("memory") or {}).get("median_over_before_run")
    mem_ratio = float(mem_ratio) if isinstance(mem_ratio, (int, float)) else None
    contended = bool((isinstance(ratio, (int, float)) and ratio > CONTENDED_PROBE_RATIO)
                     or (p90_ratio is not None and p90_ratio > CONTENDED_PROBE_P90_RATIO)
                     or (mem_ratio is not None and mem_ratio > CONTENDED_MEM_PROBE_RATIO))
    return {"probe_median_over_before_run": ratio, "probe_p90_over_before_run": p90_ratio, "probe_cv": cv,
            "mem_probe_median_over_before_run": mem_ratio, "contended": contended}


def validate_serving(trace: Trace, profile_from: Trace, predictor_cost: str = "none",
                     reference: bool = False) -> dict:
    """Replay a serving run with its own policy, predictor and engine settings under a step profile
    fitted on ``profile_from`` (another serving run), and compare with what was measured.

    Predictor cost: ``none`` (default) charges nothing beyond the fitted step times, which already
    hold the live hook's read-out (inside the forward) and, through the host gap, the scheduler's
    ordering; ``charged`` adds the simulator's modelled cost (a GPU model of the serving H100, not
    this engine) on top. Either way the modelled cost of the same run is reported beside the live one."""
    if predictor_cost not in PREDICTOR_COSTS:
        raise ValueError(f"--predictor-cost {predictor_cost!r}: choose from {', '.join(PREDICTOR_COSTS)}")
    if same_run(profile_from, trace) and not reference:   # reference: a gain's FCFS replay, never reported
        raise ValueError(f"trace {trace.name!r}: the profile must be fitted on another run, not on itself")
    s = _serving(trace)
    live_pred = s.get("predictor", "none")
    if live_pred not in LIVE_PREDICTORS:
        raise ValueError(f"trace {trace.name!r}: live predictor {live_pred!r} has no simulator counterpart "
                         f"({', '.join(LIVE_PREDICTORS)})")
    predictor_name, policy_name = LIVE_PREDICTORS[live_pred], s.get("policy", "fcfs")
    if s.get("head_weights"):
        raise ValueError(f"trace {trace.name!r}: served with custom ssjf head weights; the simulator's ssjf uses "
                         "the shipped ones")
    if trace.arrival_s is None or "e2e_s" not in trace.table.column_names:
        raise ValueError(f"trace {trace.name!r}: no arrival_s/e2e_s; nothing to replay as served")
    from policies import make_policy
    from predictors import make_predictor

    sim_orders = (predictor_name != NO_PREDICTOR and make_predictor(predictor_name).stage == "arrival"
                  and make_policy(policy_name).uses_predictions)
    if bool(s.get("ordered_admission", False)) != sim_orders:
        raise ValueError(f"trace {trace.name!r}: the live run {'ordered' if s.get('ordered_admission') else 'did not order'} "
                         f"admission, the simulator {'does' if sim_orders else 'does not'} for {policy_name} + "
                         f"{live_pred}; not replayable as it ran")
    source = source_trace(trace)
    workload = serving_workload(trace, source)
    seg_col = (trace.table.column("run").to_numpy(zero_copy_only=False).astype(np.int64)
               if "run" in trace.table.column_names else np.zeros(len(trace), dtype=np.int64))
    config = serving_engine_config(trace)
    profile = serving_profile(profile_from)
    train, readout_note = (_readout_check(trace) if predictor_name in ("leap", "leap-rls")
                           else ("lmsys", None))
    live_cfg = (((trace.metadata or {}).get("backend_details") or {}).get("engine_args") or {}) \
        .get("additional_config", {}).get("leap_live", {})
    update_every = int(live_cfg.get("update_every") or 8)
    charge = predictor_cost == "charged"
    sim = _simulate_segments(workload, seg_col, policy_name, predictor_name, train, profile, config, charge, update_every)
    modelled = sim if charge or predictor_name == NO_PREDICTOR else _simulate_segments(
        workload, seg_col, policy_name, predictor_name, train, profile, config, True, update_every)

    real = measured(workload)
    out_tok = workload.output_tokens.astype(np.float64)
    arrival = workload.arrival_s
    real_makespan = sum(float(np.max((arrival + real["e2e"])[seg_col == k]) - np.min(arrival[seg_col == k]))
                        for k in np.unique(seg_col))
    row = {"run": trace.name, "policy": policy_name, "predictor": live_pred, "load": serving_load(trace),
           "rate_req_s": s.get("rate_req_s"), "requests": len(workload), "segments": int(len(np.unique(seg_col))),
           "replay": "the client's send times (latencies counted from them), each segment from an empty engine",
           "profile_from": profile_from.name, "profile_runs_dropped": profile.describe()["runs_dropped"],
           "profile_host_gap_s": profile.host_gap_s, "predictor_cost": predictor_cost,
           "workload": serving_workload_key(trace), "max_resident": config.max_resident,
           "decode_slots": config.decode_slots, "wait_cap": config.wait_cap}
    row.update(_figures("real", real["e2e"], real["ttft"], out_tok, real_makespan))
    row.update(_figures("sim", sim["e2e"], sim["ttft"], out_tok, sim["makespan_s"]))
    row["real_throughput_tok_s"] = float(out_tok.sum() / real_makespan) if real_makespan > 0 else float("nan")
    row["sim_throughput_tok_s"] = float(out_tok.sum() / sim["makespan_s"]) if sim["makespan_s"] > 0 else float("nan")
    row.update(replay_errors(row, sim["e2e"], real["e2e"]))
    row.update(probe_summary(trace))
    ratio = step_time_ratio(trace, profile)
    row["step_time_ratio"] = ratio
    # spread within the run: a host that changes speed mid-run (a phase at half the step time)
    row["step_time_ratio_p10"] = step_time_ratio(trace, profile, 10.0)
    row["step_time_ratio_p90"] = step_time_ratio(trace, profile, 90.0)
    row["host_mismatch"] = ratio is not None and not (1 / HOST_MISMATCH_FACTOR <= ratio <= HOST_MISMATCH_FACTOR)
    if ratio is not None:   # the same replay at the run's own host speed: the error host speed leaves
        fast = _simulate_segments(workload, seg_col, policy_name, predictor_name, train, AtRunSpeed(profile, ratio),
                                  config, charge, update_every)
        at = _figures("at", fast["e2e"], fast["ttft"], out_tok, fast["makespan_s"])
        row["sim_mean_ptl_s_at_run_speed"] = at["at_mean_ptl_s"]
        row["p95_e2e_err_at_run_speed"] = at["at_p95_e2e_s"] / row["real_p95_e2e_s"] - 1.0
        row["mean_e2e_err_at_run_speed"] = at["at_mean_e2e_s"] / row["real_mean_e2e_s"] - 1.0
    row.update(live_prediction_cost(trace))
    row["sim_predictor_gpu_s"] = modelled["gpu_s_charged"]
    row["sim_predictor_cpu_s"] = modelled["predictor_cpu_s"]
    row["sim_cost_share_run"] = (modelled["gpu_s_charged"] / modelled["makespan_s"]) if modelled["makespan_s"] else 0.0
    if readout_note:
        row["readout_check"] = readout_note
    if "predicted_tokens" in trace.table.column_names and predictor_name != NO_PREDICTOR:
        live_est = trace.table.column("predicted_tokens").to_numpy(zero_copy_only=False).astype(np.float64)
        ok = np.isfinite(live_est) & np.isfinite(sim["predicted"])
        if ok.any():   # the live scheduler's first estimate vs the simulator's, same request
            diff = np.abs(live_est[ok] - sim["predicted"][ok])
            row["first_estimate_median_abs_diff"] = float(np.median(diff))
            row["first_estimate_max_abs_diff"] = float(np.max(diff))
    return row


def gain(run_ptl: float, fcfs_ptl: float) -> float:
    """Relative change of mean PTL against FCFS (negative = the policy is faster)."""
    return run_ptl / fcfs_ptl - 1.0


def add_gains(rows: list[dict], traces: list[Trace], sim_reference: dict[str, float] | None = None,
              chosen: Trace | None = None) -> None:
    """For each non-FCFS row: real and simulated gain of mean PTL over the FCFS run of the same
    workload at the same load (found among ``traces``, whose rows are in ``rows`` by run name), and
    their gap in percentage points. Rows without such an FCFS run get None. ``sim_reference`` (run
    name -> simulated mean PTL of its FCFS run under the *same* step profile as the run) makes the
    simulated gain a comparison of two replays on one engine model, as a user predicting a policy's
    gain would run them; without it the FCFS row's own replay is the reference."""
    by_name = {r["run"]: r for r in rows}
    for trace in traces:
        row = by_name.get(trace.name)
        if row is None or is_fcfs_run(trace):
            continue
        partner = fcfs_partner(trace, traces, chosen)
        ref = by_name.get(partner.name) if partner is not None else None
        if ref is None:
            row.update(fcfs_run=None, real_gain_vs_fcfs=None, sim_gain_vs_fcfs=None, gain_gap_pp=None)
            continue
        real = gain(row["real_mean_ptl_s"], ref["real_mean_ptl_s"])
        reference = (sim_reference or {}).get(row["run"], ref["sim_mean_ptl_s"])
        sim = gain(row["sim_mean_ptl_s"], reference)
        row.update(fcfs_run=ref["run"], real_gain_vs_fcfs=real, sim_gain_vs_fcfs=sim,
                   gain_gap_pp=100.0 * (sim - real))


def serving_runs_in(folder) -> list[Trace]:
    """The finished seconds-clocked serving runs in a folder (traces/live/): runs still being recorded
    (a ``.parts`` folder beside them) and step-clocked runs (:mod:`experiments.validate_steps`) are left out."""
    from pathlib import Path

    folder = Path(folder)
    if not folder.is_dir():
        return []
    runs = []
    for p in sorted(folder.glob("*.parquet")):
        if p.name.endswith(SIDE_TABLE_SUFFIXES) or p.with_name(p.name + ".parts").exists():
            continue
        t = load_trace(p)
        if is_serving(t) and trace_clock(t) == "seconds":
            runs.append(t)
    return runs


def validate_serving_runs(traces: list[Trace], profile_from: Trace | None = None,
                          predictor_cost: str = "none", candidates: list[Trace] | None = None,
                          reference: Trace | None = None) -> list[dict]:
    """Validate each serving run (profile from ``profile_from`` or the default other run among
    ``candidates``, default: the given runs and their folder's other runs), then add the gains."""
    pool = list(traces)
    if candidates is None:
        candidates = [x for t in traces if t.path is not None for x in serving_runs_in(t.path.parent)]
    for t in candidates:
        if not any(same_run(t, p) for p in pool):
            pool.append(t)
    done: dict[str, dict] = {}
    wanted = list(traces)
    # FCFS partners of non-FCFS runs are replayed too (their simulated PTL is the gain's reference)
    for t in traces:
        if not is_fcfs_run(t):
            partner = fcfs_partner(t, pool, reference)
            if partner is not None and not any(same_run(partner, w) for w in wanted):
                wanted.append(partner)
    sources: dict[str, Trace] = {}
    for t in wanted:
        # an explicit profile run never validates itself: that run gets the default other run
        src = profile_from if profile_from is not None and not same_run(profile_from, t) \
            else default_profile_source(t, pool)
        sources[t.name] = src
        done[t.name] = validate_serving(t, src, predictor_cost)
    # the simulated gain: the run and its FCFS run replayed under one profile (the run's own)
    sim_reference = {}
    for t in wanted:
        partner = None if is_fcfs_run(t) else fcfs_partner(t, wanted, reference)
        if partner is not None:
            ref = done[partner.name] if same_run(sources[partner.name], sources[t.name]) \
                else validate_serving(partner, sources[t.name], predictor_cost, reference=True)
            sim_reference[t.name] = ref["sim_mean_ptl_s"]
            done[t.name]["sim_fcfs_mean_ptl_s"] = ref["sim_mean_ptl_s"]
    add_gains(list(done.values()), wanted, sim_reference, reference)
    for t in wanted:   # how fast the host ran each run relative to its FCFS reference
        row = done[t.name]
        partner = None if is_fcfs_run(t) else fcfs_partner(t, wanted, reference)
        if partner is not None and partner.steps is not None:
            ratio = step_time_ratio(t, serving_profile(partner))
            row["step_time_ratio_vs_fcfs"] = ratio
            row["gain_host_mismatch"] = ratio is not None and not (
                1 / HOST_MISMATCH_FACTOR <= ratio <= HOST_MISMATCH_FACTOR)
    names = {t.name for t in traces}
    rows = [done[t.name] for t in wanted if t.name in names]
    return rows


def _f(value, spec: str) -> str:
    if value is None or (isinstance(value, float) and not np.isfinite(value)):
        return "-"
    if spec == "%":
        return f"{value:+.1%}"
    if spec == "pp":
        return f"{value:+.1f}"
    return format(value, spec)


def _table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    lines = ["| " + " | ".join(c[0] for c in columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        lines.append("| " + " | ".join(_f(r.get(key), spec) for _, key, spec in columns) + " |")
    return "\n".join(lines) + "\n"


def serving_report_section(rows: list[dict]) -> str:
    """Markdown for serving runs: the validation table (measured vs simulated, profile fitted on
    another run) and the live Table 3 analogue with the simulated gain over FCFS beside the measured."""
    if not rows:
        return "## Live serving runs\n\nNo serving runs in `traces/live/`.\n"
    rows = sorted(rows, key=lambda r: (r.get("workload", ""), r.get("load") or 0.0,
                                        r["predictor"] != "none", r["predictor"], r["run"]))
    first = rows[0]
    text = ["## Live serving runs: measured vs simulated\n",
            f"Open-loop serving runs of vLLM (`leap-serve`, `traces/live/`), each replayed by the simulator "
            "with the live run's own policy, predictor, resident cap, decode slots, wait cap and token budget "
            "(chunked prefill, decodes in the budget), every request at the client's send time (latencies counted from it on both sides) and forced "
            "length, under a step profile fitted on a *different* run's steps (`profile from`) plus that run's "
            f"busy host gap; predictor cost: {first['predictor_cost']} (the fitted steps already hold the live "
            "hook's read-out). Errors are simulated / measured - 1; per-request error is the median of "
            "|sim - real| / real e2e. `contended`: the drift probe ran over "
            f"{CONTENDED_PROBE_RATIO}x its quiet median (or its p90 over {CONTENDED_PROBE_P90_RATIO}x). "
            "`steps x profile run`: median of the run's measured step time over the profile's for the same "
            f"steps; `host mismatch` when it is off by more than {HOST_MISMATCH_FACTOR:g}x either way (the host "
            "ran the two runs at different speeds, which the cache-resident probe does not see). `at run speed`: the "
            "same replay with the profile's step times scaled by that ratio (one scalar fitted on the run itself, "
            "so a diagnostic, not a validation): the error left once the host's speed is taken out.\n",
            _table(rows, [("run", "run", ""), ("policy", "policy", ""), ("predictor", "predictor", ""),
                          ("load", "load", "g"), ("requests", "requests", "d"), ("profile from", "profile_from", ""),
                          ("real mean e2e s", "real_mean_e2e_s", ".2f"), ("sim", "sim_mean_e2e_s", ".2f"),
                          ("err", "mean_e2e_err", "%"), ("real p50", "real_p50_e2e_s", ".2f"),
                          ("sim p50", "sim_p50_e2e_s", ".2f"), ("real p95", "real_p95_e2e_s", ".2f"),
                          ("sim p95", "sim_p95_e2e_s", ".2f"), ("p95 err", "p95_e2e_err", "%"),
                          ("real p99", "real_p99_e2e_s", ".2f"), ("sim p99", "sim_p99_e2e_s", ".2f"),
                          ("median per-req err", "median_abs_e2e_err", ".1%"),
                          ("real TTFT", "real_mean_ttft_s", ".3f"), ("sim TTFT", "sim_mean_ttft_s", ".3f"),
                          ("real p95 TTFT", "real_p95_ttft_s", ".3f"), ("sim p95 TTFT", "sim_p95_ttft_s", ".3f"),
                          ("real TPOT", "real_mean_tpot_s", ".4f"), ("sim TPOT", "sim_mean_tpot_s", ".4f"),
                          ("real makespan s", "real_makespan_s", ".1f"), ("sim makespan s", "sim_makespan_s", ".1f"),
                          ("probe x quiet", "probe_median_over_before_run", ".2f"), ("contended", "contended", ""),
                          ("steps x profile run", "step_time_ratio", ".2f"), ("host mismatch", "host_mismatch", ""),
                          ("p95 err at run speed", "p95_e2e_err_at_run_speed", "%"),
                          ("mean err at run speed", "mean_e2e_err_at_run_speed", "%")]),
            "\n## Live Table 3 analogue: measured gain over FCFS beside the simulated gain\n",
            "Gain = mean PTL / mean PTL of the FCFS run of the same workload at the same load - 1 (negative = "
            "faster); gap = simulated - measured gain in percentage points; `steps x FCFS run`: the run's step times over "
            "its FCFS run's for the same steps (a measured gain across runs on a differently loaded host is "
            "confounded by it). Prediction cost live: the scheduler's "
            "ordering + the hook's read-out as a share of the scheduler's step time (median per step / whole run); "
            "simulated: the GPU seconds the simulator's cost model would charge for the same run, as a share "
            "of its makespan.\n",
            _table(rows, [("run", "run", ""), ("load", "load", "g"), ("predictor", "predictor", ""),
                          ("mean PTL s", "real_mean_ptl_s", ".4f"), ("mean e2e s", "real_mean_e2e_s", ".2f"),
                          ("p95 e2e s", "real_p95_e2e_s", ".2f"), ("mean TTFT s", "real_mean_ttft_s", ".3f"),
                          ("tok/s", "real_throughput_tok_s", ".1f"),
                          ("live cost median", "live_cost_share_median", ".2%"),
                          ("live cost run", "live_cost_share_run", ".2%"),
                          ("sim cost", "sim_cost_share_run", ".2%"),
                          ("real gain", "real_gain_vs_fcfs", "%"), ("sim gain", "sim_gain_vs_fcfs", "%"),
                          ("gap pp", "gain_gap_pp", "pp"), ("steps x FCFS run", "step_time_ratio_vs_fcfs", ".2f")])]
    notes = sorted({r["readout_check"] for r in rows if r.get("readout_check")})
    if notes:
        text.append("\nLEAP read-out: " + "; ".join(notes) + ".\n")
    return "\n".join(text)


def check_serving_runs(folder=None) -> int:
    """What a live report section needs, checked before any run: each finished serving run in
    ``folder`` loads and its source trace is here with the same content. Returns the number of
    runs; raises ValueError/TraceError naming the run."""
    from core.trace import traces_dir

    runs = serving_runs_in(traces_dir() / "live" if folder is None else folder)
    for t in runs:
        source_trace(t)
    return len(runs)


def live_report_section(folder=None, predictor_cost: str = "none") -> str:
    """The ``leap-report`` section of the serving runs in ``folder`` (default traces/live/): both
    tables, or a note that there are none; a run without another run of its workload to fit the
    profile on is named as not validated."""
    from core.trace import traces_dir

    folder = traces_dir() / "live" if folder is None else folder
    runs = serving_runs_in(folder)
    usable, skipped = [], []
    for t in runs:
        try:
            default_profile_source(t, runs)
            usable.append(t)
        except ValueError:
            skipped.append(t.name)
    if usable:
        text = serving_report_section(validate_serving_runs(usable, predictor_cost=predictor_cost, candidates=runs))
    else:
        text = serving_report_section([]) if not skipped else "## Live serving runs\n"
    if skipped:
        text += (f"\nNot validated (no other serving run of the same workload to fit the step profile on): "
                 f"{', '.join(skipped)}.\n")
    return text

