"""The fleet study (docs/results.md "Fleets"): routers x policies at several fleet sizes, each
against round-robin + FCFS on the same seed, with 95% t-intervals over seeds.

    python -m experiments.fleet_study --replicas 4,16 --per-replica 500 --seeds 5 --load 1.3 > fleet.md

What LEAP adds at the router (least-work on LEAP+RLS estimates, FCFS replicas), at the replica
(round-robin, countdown on LEAP+RLS), and at both; least-requests is the field's default and
oracle-work + oracle countdown the bound. Runs on the reference engine, one after another.

``--arrivals FILE.csv`` replays recorded timestamps (the Azure LLM inference traces: ``scripts/fetch_data.py``
puts them in the shared data folder's ``arrivals/``) instead of Poisson arrivals: seed s replays the window of
N consecutive arrivals (N = the run's requests) starting at an offset drawn from ``default_rng(s)``, stretched
to the load's mean rate (the whole file, its gaps tiled, when it holds fewer than N). ``--kv-blocks N`` gives each
replica N KV blocks (docs/semantics.md "KV blocks"), so memory binds and requests are preempted. ``--json FILE``
is rewritten atomically after every run; a rerun with the same settings skips the runs it holds.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from core.arrivals import read_timestamps_csv
from core.checks import bounded_int, check_writable, output_path, split_list
from core.contract import TraceError
from core.errors import OneLineParser, UsageError, run_command
from core.io import atomic_write_json, file_sha256
from core.trace import load_trace
from simulator.config import EngineConfig
from simulator.engine import check_kv_blocks
from simulator.metrics import result_latencies
from simulator.runner import RunConfig, execute, prepare
from simulator.workload import ArrivalSpec


@dataclass(frozen=True)
class Arm:
    label: str
    router: str
    predictor: str
    policy: str


ARMS = (
    Arm("round-robin + FCFS (baseline)", "round-robin", "none", "fcfs"),
    Arm("least-requests + FCFS", "least-requests", "none", "fcfs"),
    Arm("LEAP at the replica: round-robin + countdown", "round-robin", "leap-rls", "countdown"),
    Arm("LEAP at the router: least-work + FCFS", "least-work", "leap-rls", "fcfs"),
    Arm("LEAP at both: least-work + countdown", "least-work", "leap-rls", "countdown"),
    Arm("bound: oracle-work + oracle countdown", "oracle-work", "oracle", "countdown"),
)
METRICS = ("mean_e2e_s", "p99_e2e_s", "mean_tpot_s", "p99_tpot_s")
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


@dataclass(frozen=True)
class Setup:
    """What every run of one study shares (the settings a resumed ``--json`` must match)."""
    trace: str
    load: float
    per_replica: int
    kv_blocks: int | None = None
    arrivals: np.ndarray | None = None    # recorded arrival times (s), or None for Poisson
    prefix_caching: bool = True           # with KV blocks: vLLM's prefix caching (docs/semantics.md)


def arrival_window(times: np.ndarray, n: int, seed: int) -> np.ndarray:
    """Seed ``seed``'s ``n`` consecutive arrivals of ``times`` from an offset drawn from ``default_rng(seed)``,
    shifted to start at 0 (all of ``times`` when it holds fewer than ``n``: the engine tiles its gaps)."""
    if n >= len(times):
        return times
    start = int(np.random.default_rng(seed).integers(0, len(times) - n + 1))
    return times[start:start + n] - times[start]


def run_arm(arm: Arm, setup: Setup, replicas: int, seed: int) -> dict:
    """One run's figures (TPOT per request = (finish - first token) / (output tokens - 1)); the trace is
    tiled to ``per_replica`` x ``replicas`` requests, so every fleet size holds the same queue per replica."""
    n = setup.per_replica * replicas
    with tempfile.TemporaryDirectory(prefix="fleet_study_") as folder:
        arrivals = ArrivalSpec()
        if setup.arrivals is not None:   # the seed's window, read back by the engine's own CSV path
            path = Path(folder) / "arrivals.csv"
            path.write_text("arrival_s\n" + "".join(f"{float(t)!r}\n" for t in arrival_window(setup.arrivals, n, seed)))
            arrivals = ArrivalSpec("csv", path)
        config = RunConfig(trace=setup.trace, predictor=arm.predictor, policy=arm.policy, load=setup.load, seed=seed,
                           replicas=replicas, router=arm.router, kernel="reference", tile=n, arrivals=arrivals,
                           engine_config=EngineConfig(kv_blocks=setup.kv_blocks, prefix_caching=(
                               setup.prefix_caching if setup.kv_blocks is not None else None)))
        summary, result = execute(prepare(config))
    tpot = result_latencies(result)["tpot"]
    figures = {"mean_e2e_s": summary["mean_e2e_s"], "p99_e2e_s": summary["p99_e2e_s"],
               "mean_tpot_s": float(tpot.mean()), "p99_tpot_s": float(np.percentile(tpot, 99)),
               "balance": summary["replica_work_max_over_mean"]}
    if "preemptions" in summary:
        figures["preemptions"] = summary["preemptions"]
        figures["requests_preempted"] = summary["requests_preempted"]
    return figures


def interval(values: list[float]) -> tuple[float, float]:
    """Mean and 95% half-width (Student t over seeds)."""
    x = np.asarray(values, dtype=np.float64)
    if len(x) < 2:
        return float(x.mean()), float("nan")
    return float(x.mean()), T_975.get(len(x) - 1, 1.96) * float(x.std(ddof=1)) / np.sqrt(len(x))


def table(runs: dict, replicas: int, seeds: list[int]) -> list[str]:
    """Markdown rows: each arm's figures (mean over seeds) and change vs the baseline, paired by seed."""
    base = ARMS[0].label
    kv = "preemptions" in runs[(replicas, base, seeds[0])]
    lines = [f"**{replicas} replicas**", "",
             "| arm | mean e2e (s) | vs base | p99 e2e (s) | vs base | mean TPOT (ms) | vs base | p99 TPOT (ms) "
             "| vs base | balance |" + (" preemptions / run | requests preempted / run |" if kv else ""),
             "|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if kv else "")]
    for arm in ARMS:
        cells = [arm.label]
        for metric in METRICS:
            scale = 1000.0 if "tpot" in metric else 1.0
            values = [runs[(replicas, arm.label, s)][metric] for s in seeds]
            mean, half = interval(values)
            cells.append(f"{mean * scale:.3g} ± {half * scale:.2g}")
            if arm.label == base:
                cells.append("-")
                continue
            change = [100.0 * (runs[(replicas, arm.label, s)][metric] / runs[(replicas, base, s)][metric] - 1)
                      for s in seeds]
            c_mean, c_half = interval(change)
            cells.append(f"{c_mean:+.1f}% ± {c_half:.1f}")
        balance = [runs[(replicas, arm.label, s)]["balance"] for s in seeds]
        cells.append(f"{np.mean(balance):.2f}")
        for name in ("preemptions", "requests_preempted") if kv else ():
            cells.append(f"{np.mean([runs[(replicas, arm.label, s)][name] for s in seeds]):.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = OneLineParser(prog="fleet_study", description=(__doc__ or "").splitlines()[0])
    p.add_argument("--trace", default="sharegpt")
    p.add_argument("--replicas", default="4,16", help="comma list of fleet sizes")
    p.add_argument("--load", type=float, default=1.3, help="multiple of the fleet's FCFS capacity")
    p.add_argument("--per-replica", type=bounded_int(1, 100_000), default=500,
                   help="requests per replica (the trace tiled to this x replicas)")
    p.add_argument("--seeds", type=bounded_int(2, 10), default=5)
    p.add_argument("--arrivals", type=output_path, help="CSV of recorded timestamps (e.g. the Azure traces) "
                   "replayed from a seeded offset, instead of Poisson arrivals")
    p.add_argument("--kv-blocks", type=bounded_int(1, 2**31 - 1), help="KV blocks per replica (default: unbounded)")
    p.add_argument("--prefix-caching", choices=("on", "off"),
                   help="with --kv-blocks: vLLM's prefix caching (default on with --kv-blocks, as in vLLM: a "
                        "preempted request re-hits what is left of its blocks)")
    p.add_argument("--json", type=output_path, help="every run's figures, rewritten after each run; a rerun "
                   "with the same settings skips the runs it holds")
    return p.parse_args(argv)


def check_setup(args: argparse.Namespace) -> tuple[Setup, list[int], dict, dict]:
    """Every input checked before the first run (one line, exit 2): the fleet sizes, the trace, the
    arrivals file, the KV cache against the trace's largest request, and the ``--json`` to resume."""
    sizes = []
    for text in split_list("--replicas", args.replicas):
        try:
            sizes.append(bounded_int(2, 4096)(text))
        except argparse.ArgumentTypeError as exc:
            raise UsageError(f"--replicas {text!r}: {exc}") from None
    if not (np.isfinite(args.load) and args.load > 0):
        raise UsageError(f"--load {args.load}: must be a positive multiple of capacity")
    check_kv_blocks(load_trace(args.trace), EngineConfig(kv_blocks=args.kv_blocks))
    arrivals = read_timestamps_csv(args.arrivals) if args.arrivals is not None else None
    if args.prefix_caching == "on" and args.kv_blocks is None:
        raise UsageError("--prefix-caching on: needs --kv-blocks (prefix caching is modelled over KV blocks)")
    caching = args.kv_blocks is not None and args.prefix_caching != "off"
    setup = Setup(args.trace, args.load, args.per_replica, args.kv_blocks, arrivals, caching)
    settings = {"trace": args.trace, "load": args.load, "per_replica": args.per_replica, "kv_blocks": args.kv_blocks,
                "prefix_caching": caching,
                "arrivals": None if args.arrivals is None else
                f"{args.arrivals.name} sha256:{file_sha256(args.arrivals)[:16]}"}
    return setup, sizes, settings, resumed(args.json, settings)


def resumed(path: Path | None, settings: dict) -> dict:
    """The runs an earlier ``--json`` of the same settings holds, keyed (replicas, arm, seed)."""
    if path is None:
        return {}
    check_writable("--json", path)
    if not path.exists():
        return {}
    try:
        saved = json.loads(path.read_text())
        held, rows = saved["settings"], saved["runs"]
        runs = {(r["replicas"], r["arm"], r["seed"]): {k: v for k, v in r.items() if k not in ("replicas", "arm", "seed")}
                for r in rows}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"--json {path}: not a fleet_study results file ({exc}); name another file") from None
    if held != settings:
        raise UsageError(f"--json {path}: holds runs of other settings ({held}); name another file")
    return runs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup, sizes, settings, runs = check_setup(args)
    seeds = list(range(args.seeds))
    started = time.process_time()
    for replicas in sizes:
        for seed in seeds:
            for arm in ARMS:
                key = (replicas, arm.label, seed)
                if key in runs:
                    continue
                runs[key] = run_arm(arm, setup, replicas, seed)
                print(f"fleet_study: {replicas} {arm.router} {arm.predictor} {arm.policy} seed {seed}: "
                      f"{runs[key]}", file=sys.stderr, flush=True)
                if args.json is not None:
                    atomic_write_json(args.json, {"settings": settings, "runs": [
                        {"replicas": k[0], "arm": k[1], "seed": k[2], **v} for k, v in runs.items()]})
    where = ("Poisson arrivals" if setup.arrivals is None else
             f"arrivals replayed from {args.arrivals.name} (seed s: the window of consecutive arrivals from an offset "
             "drawn from default_rng(s), stretched to the rate)")
    print(f"Trace {args.trace} tiled to {args.per_replica} requests per replica, {where} at {args.load:g}x the fleet's "
          f"FCFS capacity{'' if args.kv_blocks is None else f', {args.kv_blocks} KV blocks per replica'}"
          f"{'' if args.kv_blocks is None else ', prefix caching ' + ('on' if setup.prefix_caching else 'off')}, seeds "
          f"{seeds[0]}-{seeds[-1]}; figures are means over seeds ± 95% t-interval; 'vs base' is the change "
          "against round-robin + FCFS on the same seed (mean ± 95% t-interval over seeds); balance = outstanding "
          "true work per replica, max / mean, averaged over routings.\n")
    for replicas in sizes:
        print("\n".join(table(runs, replicas, seeds)) + "\n")
    print(f"({len(runs)} runs, {time.process_time() - started:.0f} CPU-s this process)", file=sys.stderr)
    return 0


def cli(argv: list[str] | None = None) -> int:
    """``main`` with bad input as one line and exit 2 (``core.errors.run_command``)."""
    return run_command(main, argv, "fleet_study", input_errors=(TraceError, ValueError, OSError))


if __name__ == "__main__":
    sys.exit(cli())
