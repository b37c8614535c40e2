"""Wall-clock gains over repeated serving runs, with bootstrap 95% intervals (``leap-validate``).

One wall-clock run measures a policy's gain on one draw of the host's speed: two identical FCFS
runs 31 minutes apart differed by 40% in mean per-token latency (issue 20). So the interleaved
script (``scripts/live_interleaved.sh``) records each (workload, load, policy, predictor) several
times, F L R O F L R O ..., each run preceded by a host-speed check against a calibration
(``leap-serve calibrate --check``), and this module reports, per group of repeats:

- ``real_gain_vs_fcfs_ci95``: [low, high] of mean PTL (pooled over the group's requests) / mean
  PTL of the FCFS group at the same workload and load - 1, a percentile bootstrap over repeats
  and requests: each of ``BOOTSTRAP_SAMPLES`` samples draws the group's runs with replacement,
  then each drawn run's requests with replacement, both for the policy and for FCFS. Seeded
  (``BOOTSTRAP_SEED``), so the same runs give the same interval.
- ``speed_vs_calibration``: the run's check (the one recorded before it) against the calibration,
  and ``speed_after_vs_calibration``, the next check recorded after it (the host after the run);
  ``checked_speed``: the geometric mean of the two (the one before where no check follows), the
  host's speed during the run as the checks bracket it.
- ``step_time_ratio_at_checked_speed``, ``mean_e2e_err_at_checked_speed``,
  ``p95_e2e_err_at_checked_speed``: the run replayed under the calibration scaled to its checked
  speed (``Calibration.at_speed``): the calibration's prediction of the run, with the host's drift
  since the calibration measured beside the run rather than fitted on it (``at_run_speed`` is the
  latter, a diagnostic).
- ``excluded``: why a run is left out of the interval: a check before or after it more than
  ``EXCLUDE_SPEED_OFF`` off ``speed_reference`` (by default the median checked speed of the runs
  validated together: the speed the compared runs share, since the host drifts away from a
  calibration within minutes; or the calibration itself), or no check at all. Excluded runs are
  listed in every row of the group.
- ``sim_gain_vs_fcfs_calibrated``: the same pooled gain from those replays at each run's checked
  speed, beside the measured interval.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

import numpy as np

from core.calibration_files import CALIBRATION_SUFFIX
from core.trace import Trace
from experiments.serving_replay import serving_workload
from experiments.serving_runs import is_fcfs_run, serving_load, serving_workload_key
from experiments.validate_serving import measured, validate_serving
from simulator.profiles.calibration import Calibration, load_calibration
from simulator.serving import source_trace

BOOTSTRAP_SAMPLES = 2000
BOOTSTRAP_SEED = 0
#: A run whose check ran more than this far from the calibration (either way) is excluded.
EXCLUDE_SPEED_OFF = 0.03


def group_key(trace: Trace) -> tuple:
    """Runs that repeat one another: same workload and engine setting, load, policy, predictor."""
    s = (trace.metadata or {}).get("serving") or {}
    return (serving_workload_key(trace), serving_load(trace), s.get("policy"), s.get("predictor", "none"))


def request_ptl(trace: Trace) -> np.ndarray:
    """Measured per-token latency of each request (e2e from the client's send time / tokens), as
    ``leap-validate`` counts it."""
    workload = serving_workload(trace, source_trace(trace))
    return measured(workload)["e2e"] / workload.output_tokens.astype(np.float64)


def pooled_gain(policy: list[np.ndarray], fcfs: list[np.ndarray]) -> float:
    return float(np.concatenate(policy).mean() / np.concatenate(fcfs).mean() - 1.0)


def bootstrap_gain_ci(policy: list[np.ndarray], fcfs: list[np.ndarray], samples: int = BOOTSTRAP_SAMPLES,
                      seed: int = BOOTSTRAP_SEED) -> list[float]:
    """Percentile 95% interval of :func:`pooled_gain`, resampling runs, then requests within each."""
    rng = np.random.default_rng(seed)

    def draw(runs: list[np.ndarray]) -> float:
        picked = rng.integers(0, len(runs), size=len(runs))
        total = count = 0.0
        for i in picked:
            x = runs[i]
            total += float(x[rng.integers(0, len(x), size=len(x))].sum())
            count += len(x)
        return total / count

    stats = np.array([draw(policy) / draw(fcfs) - 1.0 for _ in range(samples)])
    return [float(np.percentile(stats, 2.5)), float(np.percentile(stats, 97.5))]


def checks_of(calibration: Calibration) -> list[Calibration]:
    """The checks recorded against ``calibration`` in its folder, oldest first."""
    out = []
    for f in sorted(calibration.path.parent.glob(f"*{CALIBRATION_SUFFIX}.json")):
        try:
            meta = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if meta.get("kind") == "check" and (meta.get("calibration") or {}).get("name") == calibration.name:
            out.append(load_calibration(f))
    return sorted(out, key=lambda c: (str(c.metadata.get("date")), c.name))


def run_speeds(run: str, checks: list[Calibration]) -> tuple[float | None, float | None]:
    """(before, after): the median speed of the check recorded for ``run`` and of the next one."""
    for i, check in enumerate(checks):
        if check.metadata.get("run") == run:
            after = checks[i + 1].metadata["speed_vs_calibration"]["median"] if i + 1 < len(checks) else None
            return float(check.metadata["speed_vs_calibration"]["median"]), after
    return None, None


def checked_speed(before: float | None, after: float | None) -> float | None:
    """The host's speed during a run from the checks that bracket it (geometric mean: a speed is a
    ratio); the check before it alone when none follows."""
    if before is None:
        return None
    return before if after is None else float(np.sqrt(before * after))


def replay_at_checked_speed(trace: Trace, calibration: Calibration, speed: float, predictor_cost: str) -> dict:
    """The run replayed under the calibration scaled to ``speed``: its simulated mean PTL (for the
    simulated gain) and the calibration's errors against what was measured."""
    # a calibration stands in for the profile run (name, path, steps: what the fit reads)
    row = validate_serving(trace, cast(Trace, calibration.at_speed(speed)), predictor_cost, reference=True)
    return {"sim_mean_ptl_s_at_checked_speed": row["sim_mean_ptl_s"],
            "step_time_ratio_at_checked_speed": row["step_time_ratio"],
            "mean_e2e_err_at_checked_speed": row["mean_e2e_err"],
            "p95_e2e_err_at_checked_speed": row["p95_e2e_err"]}


#: what a run's host speed is held against: the median checked speed of the runs validated together
#: (the session's own speed: what the runs compared with one another share), or the calibration
SPEED_REFERENCES = ("set", "calibration")


def speed_centre(speeds: list[float | None], reference: str) -> float:
    """The speed a run's checks must stay near: 1.0 (the calibration) or the median checked speed
    of the set; the calibration when no run has a check."""
    if reference not in SPEED_REFERENCES:
        raise ValueError(f"--speed-reference {reference!r}: choose from {', '.join(SPEED_REFERENCES)}")
    known = [x for x in speeds if x is not None]
    return float(np.median(known)) if reference == "set" and known else 1.0


def exclusion(before: float | None, after: float | None, tolerance: float = EXCLUDE_SPEED_OFF,
              centre: float = 1.0, against: str = "the calibration") -> str | None:
    """Why a run is left out (None: it is kept): no check, or a check before or after it more than
    ``tolerance`` off ``centre`` (the calibration's 1.0, or the set's median, named by ``against``)."""
    if before is None:
        return "no host-speed check recorded for this run"
    for label, speed in (("before", before), ("after", after)):
        if speed is not None and abs(speed / centre - 1.0) > tolerance:
            return (f"host {label} the run at {speed:.3f}x the calibration's step time, {speed / centre - 1:+.1%} "
                    f"off {against} (limit {tolerance:.0%} either way)")
    return None


def add_gain_intervals(rows: list[dict], traces: list[Trace], calibration: Calibration | None = None,
                       predictor_cost: str = "none", tolerance: float = EXCLUDE_SPEED_OFF,
                       reference: str = "set") -> list[dict]:
    """Add the speed, exclusion and interval fields to each row (by run name); return one summary
    per non-FCFS group with an FCFS group beside it."""
    by_name = {r["run"]: r for r in rows}
    checks = checks_of(calibration) if calibration is not None else []
    ordered = sorted(traces, key=lambda t: t.name)
    speeds = {t.name: run_speeds(t.name, checks) if calibration is not None else (None, None) for t in ordered}
    centre = speed_centre([checked_speed(*s) for s in speeds.values()], reference)
    against = f"the set's median {centre:.3f}x" if reference == "set" else "the calibration"
    groups: dict[tuple, list[Trace]] = {}
    for t in ordered:
        groups.setdefault(group_key(t), []).append(t)
        before, after = speeds[t.name]
        row = by_name.get(t.name, {})
        speed = checked_speed(before, after)
        row.update(speed_vs_calibration=before, speed_after_vs_calibration=after, checked_speed=speed,
                   speed_reference=centre if calibration is not None else None,
                   excluded=exclusion(before, after, tolerance, centre, against) if calibration is not None else None,
                   real_gain_vs_fcfs_ci95=None, sim_gain_vs_fcfs_calibrated=None)
        if calibration is not None and speed is not None and t.name in by_name:
            row.update(replay_at_checked_speed(t, calibration, speed, predictor_cost))
    summaries = []
    for key, runs in groups.items():
        fcfs = next((g for k, g in groups.items() if k[:2] == key[:2] and k[2] == "fcfs" and k[3] == "none"), None)
        if all(is_fcfs_run(t) for t in runs) or fcfs is None:
            continue
        used = [t for t in runs if not by_name.get(t.name, {}).get("excluded")]
        fcfs_used = [t for t in fcfs if not by_name.get(t.name, {}).get("excluded")]
        summary = {"workload": key[0], "load": key[1], "policy": key[2], "predictor": key[3],
                   "runs": [t.name for t in used], "fcfs_runs": [t.name for t in fcfs_used],
                   "speed_vs_calibration": {t.name: by_name.get(t.name, {}).get("speed_vs_calibration")
                                            for t in runs + fcfs},
                   "checked_speed": {t.name: by_name.get(t.name, {}).get("checked_speed") for t in runs + fcfs},
                   "excluded": {t.name: by_name[t.name]["excluded"] for t in runs + fcfs
                                if by_name.get(t.name, {}).get("excluded")},
                   "real_gain_vs_fcfs_pooled": None, "real_gain_vs_fcfs_ci95": None,
                   "sim_gain_vs_fcfs_calibrated": None}
        if used and fcfs_used:
            policy_ptl = [request_ptl(t) for t in used]
            fcfs_ptl = [request_ptl(t) for t in fcfs_used]
            summary["real_gain_vs_fcfs_pooled"] = pooled_gain(policy_ptl, fcfs_ptl)
            if len(used) >= 2 and len(fcfs_used) >= 2:
                summary["real_gain_vs_fcfs_ci95"] = bootstrap_gain_ci(policy_ptl, fcfs_ptl)
            if calibration is not None:
                summary["sim_gain_vs_fcfs_calibrated"] = _sim_gain_at_speed(used, fcfs_used, by_name)
        for t in runs:
            if t.name in by_name:
                by_name[t.name].update({k: summary[k] for k in (
                    "real_gain_vs_fcfs_pooled", "real_gain_vs_fcfs_ci95", "sim_gain_vs_fcfs_calibrated")},
                    repeats_used=summary["runs"], fcfs_repeats_used=summary["fcfs_runs"],
                    group_excluded=summary["excluded"])
        summaries.append(summary)
    return summaries


def _sim_gain_at_speed(runs: list[Trace], fcfs: list[Trace], rows: dict) -> float | None:
    """Pooled simulated gain of the replays at each run's checked speed (its request count weights
    its mean PTL, as pooling does for the measured gain); None unless every run has one."""
    def pooled(group: list[Trace]) -> float | None:
        total = count = 0.0
        for t in group:
            row = rows.get(t.name, {})
            if row.get("sim_mean_ptl_s_at_checked_speed") is None:
                return None
            total += row["sim_mean_ptl_s_at_checked_speed"] * row["requests"]
            count += row["requests"]
        return total / count

    policy, base = pooled(runs), pooled(fcfs)
    return None if policy is None or base is None else float(policy / base - 1.0)


def gains_section(summaries: list[dict]) -> str:
    """Markdown: one line per group of repeats (measured interval beside the calibrated replay)."""
    if not summaries:
        return ""

    def pct(x):
        return "-" if x is None else f"{100 * x:+.1f}%"

    def speeds(names, s):
        return ", ".join(f"{n} ({s['checked_speed'][n]:.3f}x)" if s["checked_speed"].get(n) else n
                         for n in names) or "-"

    lines = ["", "### Wall-clock gains over repeats (bootstrap 95% interval)", "",
             "| load | policy | predictor | runs (checked speed) | FCFS runs (checked speed) | real gain (pooled) | "
             "95% interval | sim gain at checked speed | excluded |", "|---|---|---|---|---|---|---|---|---|"]
    for s in summaries:
        ci = s["real_gain_vs_fcfs_ci95"]
        interval = "-" if ci is None else f"[{pct(ci[0])}, {pct(ci[1])}]"
        excluded = "; ".join(f"{k}: {v}" for k, v in s["excluded"].items()) or "none"
        lines.append(f"| {s['load']} | {s['policy']} | {s['predictor']} | {speeds(s['runs'], s)} | "
                     f"{speeds(s['fcfs_runs'], s)} | {pct(s['real_gain_vs_fcfs_pooled'])} | {interval} | "
                     f"{pct(s['sim_gain_vs_fcfs_calibrated'])} | {excluded} |")
    return "\n".join(lines) + "\n"


def calibration_section(rows: list[dict]) -> str:
    """Markdown: the calibration against each checked run, scaled to the run's checked speed."""
    rows = [r for r in rows if r.get("checked_speed") is not None]
    if not rows:
        return ""

    def fmt(x, spec):
        return "-" if x is None else format(x, spec)

    lines = ["", "### The calibration against each run, at the run's checked speed", "",
             "| run | check before | check after | checked speed | steps x checked profile | "
             "mean e2e err | p95 e2e err | excluded |", "|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: r["run"]):
        lines.append(f"| {r['run']} | {fmt(r['speed_vs_calibration'], '.3f')} | "
                     f"{fmt(r['speed_after_vs_calibration'], '.3f')} | {r['checked_speed']:.3f} | "
                     f"{fmt(r.get('step_time_ratio_at_checked_speed'), '.3f')} | "
                     f"{fmt(r.get('mean_e2e_err_at_checked_speed'), '+.1%')} | "
                     f"{fmt(r.get('p95_e2e_err_at_checked_speed'), '+.1%')} | {'yes' if r['excluded'] else 'no'} |")
    return "\n".join(lines) + "\n"


def load_profile_source(spec: str):
    """``--profile-from``: a calibration (``*.calibration.json``/``.parquet``) or a trace."""
    from core.calibration_files import is_calibration_path
    from core.trace import load_trace

    return load_calibration(spec) if is_calibration_path(spec) else load_trace(Path(spec) if Path(spec).exists()
                                                                               else spec)
