"""Speed and memory of a simulated fleet, printed as the rows of docs/results.md "Fleet speed"; not a timed test.

Every row runs in a fresh child process (so its peak RSS is its own) and prints one Markdown table row:
requests, CPU-s of the loop (``sim_cpu_s``: preparation and capacity measurement not counted), requests
per CPU-s, CPU-us per request, peak RSS, which engine ran (the compiled fleet or the reference one: a
fleet the compiled kernel does not run falls back, and says so on stderr), the single engine's cost at
the same per-replica load measured in the same run as the reference ratio, and the target.

- ``--big`` requests over 16 replicas, FCFS + least-requests (target: >= 150k requests/CPU-s, < 1 GiB);
- the same with countdown + leap + least-work (target: >= 60k requests/CPU-s);
- cost per request at equal per-replica load: ``--per-replica`` requests per replica at ``--sizes``
  replicas, FCFS + least-requests (target: flat within 1.3x of the single engine);
- KV blocks on (the profile's GPU memory) against off, 16 replicas x ``--kv-requests`` (target: within 1.5x).

Load: ``--load`` x the fleet's FCFS capacity (N x one engine's), so every fleet size and the single engine
run at the same per-replica load.

    python benchmarks/bench_fleet.py [--kernel compiled|reference] [--big 100000] [--per-replica 500]
"""

from __future__ import annotations

import os
import sys

for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):   # before numpy loads
    os.environ.setdefault(_name, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.checks import bounded_int, split_list  # noqa: E402
from core.errors import UsageError  # noqa: E402

KERNEL_CHOICES = ("compiled", "reference")
HEADER = ("| row | requests | loop CPU-s | requests/CPU-s | CPU-us/request | peak RSS MiB | engine "
          "| x single engine | target |\n|---|---|---|---|---|---|---|---|---|")


@dataclass(frozen=True)
class Run:
    """One measured run (what a child process is told)."""

    trace: str
    replicas: int
    requests: int
    load: float
    kernel: str
    policy: str = "fcfs"
    predictor: str = "none"
    router: str = "least-requests"
    kv: bool = False


def child(run: Run) -> dict:
    """Run ``run`` in this process; its loop CPU-s, requests, the engine that ran it, peak RSS in MiB."""
    from simulator.compiled import unsupported
    from simulator.config import KV_BLOCKS_FROM_PROFILE, EngineConfig
    from simulator.runner import RunConfig, execute, prepare

    config = RunConfig(trace=run.trace, load=run.load, replicas=run.replicas, tile=run.requests, kernel=run.kernel,
                       policy=run.policy, predictor=run.predictor,
                       router=run.router if run.replicas > 1 else "round-robin",
                       engine_config=EngineConfig(kv_blocks=KV_BLOCKS_FROM_PROFILE if run.kv else None))
    prepared = prepare(config)
    if run.replicas > 1:
        engine = "compiled" if type(prepared.simulation).__name__ == "CompiledFleet" else "reference"
    else:
        engine = "compiled" if run.kernel == "compiled" and unsupported(prepared.simulation) is None else "reference"
    _, result = execute(prepared)
    return {"cpu_s": float(result.sim_cpu_s), "n": len(result.finish_s), "engine": engine,
            "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def measure(run: Run) -> dict:
    """``run`` in a fresh child process (its own peak RSS); stderr passes through."""
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(asdict(run))],
                          stdout=subprocess.PIPE, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"bench_fleet: the run {asdict(run)} failed (exit {proc.returncode})")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def per_request_us(m: dict) -> float:
    return m["cpu_s"] / m["n"] * 1e6


def row(name: str, m: dict, single: dict | None, target: str) -> str:
    ratio = "-" if single is None else f"{per_request_us(m) / per_request_us(single):.1f}x"
    return (f"| {name} | {m['n']:,} | {m['cpu_s']:.2f} | {m['n'] / m['cpu_s']:,.0f} | {per_request_us(m):,.1f} "
            f"| {m['rss_mib']:,.0f} | {m['engine']} | {ratio} | {target} |")


def rows(args: argparse.Namespace, sizes: list[int]) -> list[str]:
    """The table's rows, measured in order (each printed as soon as it is measured)."""
    base = {"trace": args.trace, "load": args.load, "kernel": args.kernel}
    out: list[str] = []

    def emit(line: str) -> None:
        out.append(line)
        print(line, flush=True)

    print(HEADER, flush=True)
    big_single = measure(Run(replicas=1, requests=args.big, **base))
    emit(row("single engine, FCFS (reference ratio)", big_single, None, "-"))
    m = measure(Run(replicas=16, requests=args.big, **base))
    met = m["n"] / m["cpu_s"] >= 150_000 and m["rss_mib"] < 1024
    emit(row("16 replicas, FCFS + least-requests", m, big_single,
             f">= 150k req/CPU-s, < 1 GiB (1M requests): {'met' if met else 'not met'}"))
    leap = {"policy": "countdown", "predictor": "leap"}
    leap_single = measure(Run(replicas=1, requests=args.big, **base, **leap))
    emit(row("single engine, countdown + leap (reference ratio)", leap_single, None, "-"))
    m = measure(Run(replicas=16, requests=args.big, router="least-work", **base, **leap))
    emit(row("16 replicas, countdown + leap + least-work", m, leap_single,
             f">= 60k req/CPU-s: {'met' if m['n'] / m['cpu_s'] >= 60_000 else 'not met'}"))
    single = None
    for replicas in sizes:
        m = measure(Run(replicas=replicas, requests=args.per_replica * replicas, **base))
        single = m if single is None else single
        flat = per_request_us(m) <= 1.3 * per_request_us(single)
        emit(row(f"{replicas} replica{'s' if replicas > 1 else ''} x {args.per_replica:,}, FCFS + least-requests"
                 + (" (single engine)" if replicas == 1 else ""), m, single,
                 "flat within 1.3x: " + ("met" if flat else "not met")))
    off = measure(Run(replicas=16, requests=args.kv_requests, **base))
    emit(row("16 replicas, KV blocks off", off, None, "-"))
    on = measure(Run(replicas=16, requests=args.kv_requests, kv=True, **base))
    ratio = per_request_us(on) / per_request_us(off)
    emit(row("16 replicas, KV blocks on (ratio: x KV off)", on, off,
             f"within 1.5x of off: {'met' if ratio <= 1.5 else 'not met'}"))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--kernel", choices=KERNEL_CHOICES, default="compiled")
    ap.add_argument("--trace", default="sharegpt")
    ap.add_argument("--big", type=bounded_int(1, 10_000_000), default=100_000,
                    help="requests of the 16-replica rows and their single engine")
    ap.add_argument("--per-replica", type=bounded_int(1, 100_000), default=500)
    ap.add_argument("--sizes", default="1,4,16,64", help="fleet sizes of the cost-per-request rows (the first: 1)")
    ap.add_argument("--kv-requests", type=bounded_int(1, 10_000_000), default=20_000,
                    help="requests of the KV on/off rows (16 replicas)")
    ap.add_argument("--load", type=float, default=1.0, help="multiple of the fleet's FCFS capacity")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(Run(**json.loads(args.child)))))
        return 0
    try:
        sizes = [bounded_int(1, 4096)(s) for s in split_list("--sizes", args.sizes)]
        if sizes[0] != 1:
            raise UsageError(f"--sizes {args.sizes}: the first size is 1 (the single engine, the reference ratio)")
        if not 0 < args.load < 100:
            raise UsageError(f"--load {args.load:g}: a multiple of capacity in (0, 100)")
    except (argparse.ArgumentTypeError, UsageError) as e:
        print(f"bench_fleet: {e}", file=sys.stderr)
        return 2
    print(f"kernel {args.kernel}, trace {args.trace}, load {args.load:g}x the fleet's FCFS capacity "
          f"(1 replica: round-robin), loadavg {os.getloadavg()[0]:.1f} at start")
    rows(args, sizes)
    print(f"loadavg {os.getloadavg()[0]:.1f} at end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
