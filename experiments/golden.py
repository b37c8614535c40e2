"""Golden summary figures: CI's guard against changes that move the results.

A fixed small set of runs on the bundled traces; their key figures are stored in
``tests/golden/summaries.json`` and compared with tolerances tight enough to catch a real change
(the simulation is deterministic; the tolerance only absorbs floating-point noise across numpy
builds). After an intended change, refresh them and commit the diff:

    python -m experiments.golden --update    # rewrite tests/golden/summaries.json
    python -m experiments.golden             # compare, print mismatches, exit 1 on any
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from core.io import atomic_write_json
from core.trace import bundled_trace_names
from predictors import PREDICTORS
from simulator.runner import RunConfig, execute, prepare

GOLDEN_PATH = Path(__file__).resolve().parent.parent / "tests" / "golden" / "summaries.json"
FIELDS = ("mean_ptl_s", "mean_e2e_s", "p50_e2e_s", "p95_e2e_s", "p99_e2e_s", "mean_ttft_s",
          "long_decile_p95_e2e_s", "throughput_tok_s", "steps", "forced_steps", "spearman", "kendall_tau",
          "capacity_req_s")
RELATIVE_TOLERANCE = 1e-4
ABSOLUTE_TOLERANCE = 1e-9

# (trace, predictor, policy, load, requests, extra options)
RUNS = [
    ("sharegpt-lengths", "none", "fcfs", 1.5, 800, {}),
    ("sharegpt-lengths", "oracle", "countdown", 1.5, 800, {}),
    ("sharegpt-lengths", "oracle", "aging", 1.5, 800, {}),
    ("sharegpt-lengths", "noisy-oracle", "countdown", 1.5, 800, {"noise_mae": 100.0}),
    ("sharegpt-lengths", "oracle", "countdown", 2.0, 800, {"wait_cap": 0}),
    ("lmsys", "none", "fcfs", 1.5, 600, {}),
    ("lmsys", "leap", "countdown", 1.5, 600, {}),
    ("lmsys", "leap-rls", "countdown", 1.5, 600, {}),
    ("lmsys", "tie", "aging", 1.5, 600, {}),
    ("lmsys", "trail", "countdown", 1.5, 600, {}),
    ("sharegpt", "none", "fcfs", 1.5, 600, {}),
    ("sharegpt", "leap", "countdown", 1.5, 600, {}),
    ("sharegpt", "leap-rls", "countdown", 1.5, 600, {}),
    ("sharegpt", "leap", "aging", 1.5, 600, {}),
    # Table 4 style: trained on lmsys, served on another domain, no prediction cost
    ("alpaca", "leap-rls", "aging", 1.5, 400, {"charge_cost": False}),
    ("alpaca", "egtp", "aging", 1.5, 400, {"charge_cost": False}),
    ("math", "leap", "aging", 1.5, 400, {"charge_cost": False}),
    ("multilingual", "leap-rls", "aging", 1.5, 400, {"charge_cost": False}),
]


def run_id(run) -> str:
    trace, predictor, policy, load, requests, extra = run
    tail = "".join(f",{k}={v}" for k, v in sorted(extra.items()))
    return f"{trace}/{predictor}/{policy}/{load:g}x/n{requests}{tail}"


def available_runs() -> list[tuple]:
    """Runs whose trace is bundled with at least the requests they use (recordings grow across sessions)."""
    from core.trace import load_trace

    traces = set(bundled_trace_names())
    return [r for r in RUNS if r[0] in traces and (r[1] == "none" or r[1] in PREDICTORS)
            and len(load_trace(r[0])) >= r[4]]


def compute(run) -> dict:
    from dataclasses import replace

    from predictors.base import PredictorOptions
    from simulator.engine import EngineConfig

    trace, predictor, policy, load, requests, extra = run
    options = PredictorOptions(noise_mae=extra.get("noise_mae", 0.0))
    engine = EngineConfig(wait_cap=extra.get("wait_cap", 128))
    cost = extra.get("charge_cost", True)
    config = RunConfig(trace=trace, predictor=predictor, policy=policy, load=load, requests=requests, seed=0,
                       engine_config=engine, charge_cost=cost,
                       predictor_options=replace(options, seed=0))
    summary, _ = execute(prepare(config))
    return {k: summary.get(k) for k in FIELDS}


def compare(expected: dict, actual: dict) -> list[str]:
    problems = []
    for key in FIELDS:
        e, a = expected.get(key), actual.get(key)
        if e is None or a is None:
            if e != a:
                problems.append(f"{key}: expected {e}, got {a}")
            continue
        if abs(a - e) > max(RELATIVE_TOLERANCE * abs(e), ABSOLUTE_TOLERANCE):
            problems.append(f"{key}: expected {e:.6g}, got {a:.6g} ({(a - e) / e if e else float('inf'):+.2%})")
    return problems


def check(golden: dict | None = None) -> dict[str, list[str]]:
    """run id -> problems (empty lists omitted); a golden run that can no longer run is a problem."""
    golden = golden if golden is not None else json.loads(GOLDEN_PATH.read_text())
    runs = {run_id(r): r for r in RUNS}
    failures = {}
    for rid, expected in golden["runs"].items():
        if rid not in runs:
            failures[rid] = ["no longer in experiments.golden.RUNS; refresh the golden file"]
            continue
        try:
            actual = compute(runs[rid])
        except Exception as exc:  # noqa: BLE001 - report every failure, not just the first
            failures[rid] = [f"could not run: {exc}"]
            continue
        problems = compare(expected, actual)
        if problems:
            failures[rid] = problems
    return failures


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.golden", description=__doc__.splitlines()[0])
    ap.add_argument("--update", action="store_true", help="recompute and rewrite the golden file")
    args = ap.parse_args(argv)
    if args.update:
        runs = available_runs()
        golden = {"fields": list(FIELDS), "runs": {run_id(r): compute(r) for r in runs}}
        atomic_write_json(GOLDEN_PATH, golden)
        skipped = [run_id(r) for r in RUNS if r not in runs]
        print(f"wrote {GOLDEN_PATH} with {len(runs)} runs" + (f"; not available yet: {', '.join(skipped)}" if skipped else ""))
        return 0
    failures = check()
    for rid, problems in failures.items():
        print(f"{rid}:\n  " + "\n  ".join(problems))
    print("golden figures match" if not failures else f"{len(failures)} golden run(s) differ")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
