"""Markdown of the serving-run validation (``leap-report``'s live section, ``leap-validate``'s
tables): measured vs simulated, and the measured gain over FCFS beside the simulated one."""

from __future__ import annotations

import numpy as np

from experiments.serving_runs import default_profile_source, serving_runs_in
from experiments.validate_serving import (
    CONTENDED_PROBE_P90_RATIO,
    CONTENDED_PROBE_RATIO,
    HOST_MISMATCH_FACTOR,
    validate_serving_runs,
)
from simulator.serving import source_trace


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
                          ("real p99 TPOT ms", "real_p99_tpot_ms", ".0f"), ("sim p99 TPOT ms", "sim_p99_tpot_ms", ".0f"),
                          ("real makespan s", "real_makespan_s", ".1f"), ("sim makespan s", "sim_makespan_s", ".1f"),
                          ("probe x quiet", "probe_median_over_before_run", ".2f"), ("contended", "contended", ""),
                          ("steps x profile run", "step_time_ratio", ".2f"), ("host mismatch", "host_mismatch", ""),
                          ("p95 err at run speed", "p95_e2e_err_at_run_speed", "%"),
                          ("mean err at run speed", "mean_e2e_err_at_run_speed", "%")]),
            "\n## Live Table 3 analogue: measured gain over FCFS beside the simulated gain\n",
            "Gain = mean NL (normalized latency, e2e / output tokens) / mean NL of the FCFS run of the same workload at the same load - 1 (negative = "
            "faster); gap = simulated - measured gain in percentage points; `steps x FCFS run`: the run's step times over "
            "its FCFS run's for the same steps (a measured gain across runs on a differently loaded host is "
            "confounded by it). Prediction cost live: the scheduler's "
            "ordering + the hook's read-out as a share of the scheduler's step time (median per step / whole run); "
            "simulated: the GPU seconds the simulator's cost model would charge for the same run, as a share "
            "of its makespan.\n",
            _table(rows, [("run", "run", ""), ("load", "load", "g"), ("predictor", "predictor", ""),
                          ("mean NL s", "real_mean_ptl_s", ".4f"), ("mean e2e s", "real_mean_e2e_s", ".2f"),
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
