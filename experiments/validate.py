"""``leap-validate``: replay recorded traces the way they ran and compare with what was measured.

Every figure the project prints comes from the simulator; this is the check that the simulator
reproduces a real engine *out of sample*: the step-time profile is fitted on a different trace's
``steps`` table (``fitted:OTHER``), the engine settings come from the recording's own metadata
(``--preset recorded``: caps, token budget, chunked prefill, decodes counted against the budget),
and arrivals are replayed as recorded: a batch recording (closed loop, ``window`` requests in flight,
the next submitted when one finishes) in closed loop; a serving recording at its own ``arrival_s``.

Measured side, from the trace itself: ``e2e_s`` (submission to last token), ``ttft_s`` (submission to
first token), NL (normalized latency, once PTL) = e2e / output tokens, TPOT = (e2e - ttft) / (output
tokens - 1), and TTFT, TPOT, E2EL as mean/median/p90/p99 in ms (``real_p99_tpot_ms``...). Simulated side:
the same definitions with submission = the request's (released) arrival. Makespan: measured = the
sum of the recording's runs' ``wall_s`` (closed loop) or last finish - first arrival (serving).
Nothing here is tuned on the run it validates. Step-clocked serving runs (``serving.clock = "steps"``)
are checked decision by decision instead (:mod:`experiments.validate_steps`): the share of requests
whose simulated finish step equals the live one (``--json``: ``clock``, ``finish_step_match_share``,
``finish_step_mismatches``); wall-clock rows carry ``clock = "seconds"``.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from core.errors import OneLineParser, run_command
from core.trace import Trace, TraceError, load_trace
from experiments.gains import (
    EXCLUDE_SPEED_OFF,
    SPEED_REFERENCES,
    add_gain_intervals,
    calibration_section,
    gains_section,
    load_profile_source,
)
from experiments.replay_errors import replay_errors
from experiments.serving_render import serving_report_section
from experiments.serving_runs import SIDE_TABLE_SUFFIXES
from experiments.validate_choices import check_reference, name_references, register_sources
from experiments.validate_serving import PREDICTOR_COSTS, _figures, measured, validate_serving_runs
from experiments.validate_steps import step_replay_config, step_runs_section, validate_step_run
from simulator.preset import closed_loop_window
from simulator.profiles import FITTED_FROM
from simulator.profiles.calibration import Calibration
from simulator.runner import NO_PREDICTOR, RunConfig, execute, prepare
from simulator.serving import is_serving
from simulator.stepclock import trace_clock
from simulator.workload import ArrivalSpec

PROG = "leap-validate"
BATCH_TRACES = ("lmsys", "alpaca", "math", "multilingual", "sharegpt")
DEFAULT_PROFILE_FROM = "lmsys"


def replay_config(trace: Trace, profile_from: Trace, requests: int | None = None) -> RunConfig:
    """The ``simulate`` run that replays ``trace`` as it ran: ``--preset recorded``, FCFS,
    ``--engine fitted:OTHER``, and ``--arrivals recorded`` (serving) or ``closed`` (batch)."""
    if profile_from.steps is None:
        raise ValueError(f"trace {profile_from.name!r} has no steps table to fit a profile on")
    if (trace.metadata or {}).get("backend") != "vllm":
        raise ValueError(f"trace {trace.name!r} is not a vLLM recording (capture-traces); nothing to replay as it ran")
    serving = closed_loop_window(trace) is None
    if serving and trace.arrival_s is None:
        raise ValueError(f"trace {trace.name!r} is neither a closed-loop batch recording nor has arrival_s")
    source = str(profile_from.path) if profile_from.path else profile_from.name
    return RunConfig(trace=str(trace.path) if trace.path else trace.name, predictor=NO_PREDICTOR, policy="fcfs",
                     engine=FITTED_FROM + source, load=None,
                     arrivals=ArrivalSpec("recorded" if serving else "closed"),
                     requests=None if requests is None else min(requests, len(trace)), preset="recorded")


def validate_one(trace: Trace, profile_from: Trace, requests: int | None = None) -> dict:
    """Replay ``trace`` as it ran under a profile fitted on ``profile_from``; real vs simulated."""
    prepared = prepare(replay_config(trace, profile_from, requests))
    wl = prepared.workload
    window = prepared.simulation.closed_loop
    serving = window is None
    _, result = execute(prepared)
    # back to the trace's row order (the simulation's rows are sorted by arrival, stably)
    row_of = {rid: i for i, rid in enumerate(result.rows_request_id.tolist())}
    order = np.array([row_of[rid] for rid in wl.request_id.tolist()], dtype=np.int64)
    sim_e2e = (result.finish_s - result.arrival_s)[order]
    sim_ttft = (result.first_token_s - result.arrival_s)[order]
    profile = prepared.simulation.profile
    real = measured(wl)
    out_tok = np.asarray(wl.output_tokens, dtype=np.float64)
    meta = trace.metadata or {}
    runs = meta.get("runs") or []
    if serving:
        sent = wl.arrival_s
        if sent is None:
            raise ValueError(f"trace {trace.name!r}: a serving recording without arrival_s")
        real_makespan = float(np.max(sent + real["e2e"]) - np.min(sent))
    else:
        real_makespan = float(sum(r.get("wall_s", 0.0) for r in runs)) if requests is None else float("nan")
    serving_meta = meta.get("serving") or {}
    row = {"run": trace.name, "policy": serving_meta.get("policy", "fcfs"),
           "predictor": serving_meta.get("predictor", "none"), "load": serving_meta.get("load"),
           "requests": len(wl), "replay": "recorded arrivals" if serving else f"closed loop, window {window}",
           "profile_from": profile_from.name, "profile_runs_dropped": profile.describe()["runs_dropped"]}
    row.update(_figures("real", real["e2e"], real["ttft"], out_tok, real_makespan))
    row.update(_figures("sim", sim_e2e, sim_ttft, out_tok, result.makespan_s))
    errors = replay_errors(row, sim_e2e, real["e2e"])
    row.update({k: errors[k] for k in ("p95_e2e_err", "mean_e2e_err", "median_abs_e2e_err")})
    return row


def _ms(value) -> str:
    return "-" if value is None else f"{value:.0f}"


def report_section(rows: list[dict]) -> str:
    """Markdown table of validation rows, for experiments/report.py to include."""
    lines = ["| trace | profile from | requests | real P95 e2e s | sim P95 e2e s | P95 err | mean e2e err "
             "| median per-request err | real P99 TPOT ms | sim P99 TPOT ms | real makespan s | sim makespan s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['run']} | {r['profile_from']} | {r['requests']} | {r['real_p95_e2e_s']:.1f} | "
                     f"{r['sim_p95_e2e_s']:.1f} | {r['p95_e2e_err']:+.1%} | {r['mean_e2e_err']:+.1%} | "
                     f"{r['median_abs_e2e_err']:.1%} | {_ms(r.get('real_p99_tpot_ms'))} | "
                     f"{_ms(r.get('sim_p99_tpot_ms'))} | {r['real_makespan_s']:.0f} | {r['sim_makespan_s']:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``leap-validate``: bad input is one line and exit 2 (``core.errors``)."""
    return run_command(_validate, argv, PROG, input_errors=(TraceError, ValueError, OSError))


def _validate(argv: list[str]) -> int:
    p = OneLineParser(prog=PROG, description="Replay recorded traces as they ran, with a step "
                                "profile fitted on a different trace, and compare with the measurements. "
                                "Serving runs (traces/live/) replay with their own policy and predictor.")
    p.add_argument("traces", nargs="*", help=f"traces (default: {', '.join(BATCH_TRACES)}); serving runs, e.g. "
                   "traces/live/alpaca200-*.parquet")
    p.add_argument("--profile-from", help=f"trace whose steps the profile is fitted on, or a calibration "
                   "(NAME.calibration.json, leap-serve calibrate; serving runs) (batch default: "
                   f"{DEFAULT_PROFILE_FROM}, for that trace itself math; serving default: another run of the same workload "
                   "at the same load, FCFS first)")
    p.add_argument("--matrix", action="store_true", help="every (trace, profile-from) pair of distinct batch traces")
    p.add_argument("--requests", type=int, help="replay only the first N requests (batch traces)")
    p.add_argument("--predictor-cost", default="none", choices=PREDICTOR_COSTS,
                   help="serving runs: charge the simulator's modelled predictor cost on top of the fitted "
                        "steps (charged) or not (none, default: the fitted steps hold the live hook's cost)")
    p.add_argument("--reference", metavar="RUN", help="serving runs: the FCFS run gains are measured against "
                   "(default: the first FCFS run of the same workload and load in the runs' folder, named on stderr)")
    p.add_argument("--source", action="append", default=[], metavar="PATH",
                   help="serving runs (wall-clock or step-clocked): the source trace they were served from, by "
                        "path (checked by content hash)")
    p.add_argument("--speed-tolerance", type=float, default=EXCLUDE_SPEED_OFF, metavar="FRACTION",
                   help="serving runs with --profile-from CALIBRATION: a run whose host-speed check before or "
                        f"after it is more than this far from --speed-reference is excluded from the gain "
                        f"intervals, and listed (default {EXCLUDE_SPEED_OFF})")
    p.add_argument("--speed-reference", choices=SPEED_REFERENCES, default="set",
                   help="serving runs with --profile-from CALIBRATION: hold each run's checks against the median "
                        "checked speed of the runs given (set, default) or against the calibration")
    p.add_argument("--json", action="store_true", help="one JSON object per run")
    args = p.parse_args(argv)
    if not (0 < args.speed_tolerance < 1):
        raise ValueError(f"--speed-tolerance {args.speed_tolerance}: expected a fraction between 0 and 1 (e.g. 0.03)")
    # a shell glob such as traces/live/alpaca200-*.parquet also matches the side tables
    names = [n for n in args.traces if not str(n).endswith(SIDE_TABLE_SUFFIXES)] or list(BATCH_TRACES)
    traces = [load_trace(n) for n in names]
    if args.requests is not None and args.requests < 1:
        raise ValueError("--requests must be >= 1")
    stepped = [t for t in traces if is_serving(t) and trace_clock(t) == "steps"]   # decision-level check
    serving = [t for t in traces if is_serving(t) and trace_clock(t) == "seconds"]
    batch = [t for t in traces if not is_serving(t)]
    if args.source and not (serving or stepped):
        raise ValueError("--source applies to serving runs (wall-clock or step-clocked); none given")
    # before the step-clocked runs look their source up: a source given by path is found by its hash
    register_sources([load_trace(path) for path in args.source], serving + stepped)
    reference = load_trace(args.reference) if args.reference else None
    if reference is not None and not serving:
        raise ValueError("--reference applies to wall-clock serving runs (gains against an FCFS run); none given")
    if reference is not None:
        check_reference(reference, serving)
    for t in stepped:   # refused before any replay runs (read-out, predictor, clock)
        step_replay_config(t)
    if (serving or stepped) and (args.matrix or args.requests is not None):
        raise ValueError("--matrix and --requests apply to batch traces; a serving run replays whole")
    profile = load_profile_source(args.profile_from) if args.profile_from else None
    calibration = profile if isinstance(profile, Calibration) else None
    if calibration is not None and batch:
        raise ValueError(f"--profile-from {args.profile_from}: a calibration profiles serving runs only")
    if profile is not None and serving and calibration is None and not is_serving(profile):
        raise ValueError(f"--profile-from {args.profile_from}: serving runs need another serving run's steps "
                         "or a calibration (leap-serve calibrate)")
    pairs = []
    for t in batch:
        if args.matrix:
            pairs += [(t, load_trace(o)) for o in BATCH_TRACES if o != t.name]
        else:
            src = args.profile_from or (DEFAULT_PROFILE_FROM if t.name != DEFAULT_PROFILE_FROM else "math")
            pairs.append((t, load_trace(src)))
    rows = []
    for t, src in pairs:
        rows.append(validate_one(t, src, args.requests))
        if args.json:
            print(json.dumps(rows[-1], sort_keys=True), flush=True)
    serving_rows = validate_serving_runs(serving, profile, args.predictor_cost, reference=reference) if serving else []
    name_references(serving_rows, PROG)
    for row in serving_rows:   # a wall-clock run: no step-level equality to check
        row.update(clock="seconds", finish_step_match_share=None)
    gains = add_gain_intervals(serving_rows, serving, calibration, args.predictor_cost,
                               args.speed_tolerance, args.speed_reference) if serving else []
    step_rows = [validate_step_run(t) for t in stepped]
    if args.json:
        for row in serving_rows + step_rows:
            print(json.dumps(row, sort_keys=True), flush=True)
    if not args.json:
        if rows:
            print(report_section(rows), end="")
        if serving_rows:
            print(serving_report_section(serving_rows), end="")
            print(gains_section(gains), end="")
            print(calibration_section(serving_rows), end="")
        if step_rows:
            print(step_runs_section(step_rows), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
