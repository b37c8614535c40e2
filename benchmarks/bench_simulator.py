"""Simulator speed: simulated requests per CPU-second of the simulation loop, and peak memory.

Replays 4,000 requests of the default trace with FCFS at 1x and countdown + the oracle at 1x and
2x capacity, on the reference engine and on the compiled kernel (``--kernel compiled``) in the same
run, with the ratio and a check that both give identical finish times; ``--million N`` also times
N lengths-only requests at 1x with the compiled kernel, start-up included. Figures are medians over --repeat runs; the
machine is shared, so compare ratios from one run rather than absolute numbers across runs.
A trace with fewer requests than ``--requests`` is tiled: whole copies of it, each shuffled with a
fixed seed (ids suffixed ``#copy``), cut to the count, written to a temporary trace file (request
columns only; the oracle needs no features). The same arguments replay the same requests.

    python benchmarks/bench_simulator.py [--trace NAME] [--requests 4000] [--repeat 5] [--million 1000000]
        [--scale 10000,100000,1000000]

On a trace with hidden states it also times the learned predictors (``leap``, ``leap-rls``,
``trail``) on the compiled kernel beside the engine's own rate; it prints how many predictor x
policy pairs run compiled (and why the others do not); ``--scale`` times prepare against the loop at
each size.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.contract import REQUIRED_COLUMNS  # noqa: E402
from core.trace import bundled_trace_names, load_trace, tile_trace  # noqa: E402
from simulator.runner import RunConfig, execute, prepare  # noqa: E402

TILE_SEED = 0


def tiled_trace(name: str, requests: int, folder: Path) -> tuple[str, int]:
    """The trace itself when it has enough requests, else the path of a tiled copy (the project's
    one tiling, :func:`core.trace.tile_trace`, each copy shuffled); and its size."""
    import pyarrow.parquet as pq

    trace = load_trace(name)
    n = len(trace)
    if requests <= n:
        return name, n
    table = tile_trace(trace, requests, shuffle_seed=TILE_SEED).table.select(list(REQUIRED_COLUMNS))
    path = folder / f"{trace.name}-x{requests}.parquet"
    pq.write_table(table.replace_schema_metadata(trace.table.schema.metadata), path)
    return str(path), n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = next(t for t in ("sharegpt", "sharegpt-lengths") if t in bundled_trace_names())
    ap.add_argument("--trace", default=default)
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--load", type=float, default=None,
                    help="one load for both cases (default: FCFS at 1x, countdown + oracle at 1x and 2x)")
    ap.add_argument("--million", type=int, default=0, metavar="N",
                    help="also time N lengths-only requests at 1x with the compiled kernel, start-up included")
    ap.add_argument("--scale", default="10000,100000,1000000", metavar="N,N,...",
                    help="compiled runs of N lengths-only requests at 1x: prepare (tiling, capacity, arrivals, "
                         "binding) against the loop, per size ('' to skip)")
    ap.add_argument("--fleet", type=int, default=0, metavar="R",
                    help="a compiled fleet of R replicas (FCFS, least-requests, 1x): --fleet-requests lengths-only "
                         "requests in a fresh process (loop req/CPU-s, peak RSS), then loop CPU per request at "
                         "1, 4, 16 and 64 replicas with --fleet-per-replica requests each (equal per-replica load)")
    ap.add_argument("--fleet-requests", type=int, default=100_000, metavar="N")
    ap.add_argument("--fleet-per-replica", type=int, default=2000, metavar="N")
    ap.add_argument("--startup-cache", default=None, metavar="DIR",
                    help="time the compiled kernel's start-up on numba cache DIR (default: an empty one, the "
                         "first process compiles)")
    ap.add_argument("--scale-loads", default="1.0,0.8", metavar="X,X,...",
                    help="the loads of the --scale runs (default 1x, the critical load, and 0.8x)")
    args = ap.parse_args()
    try:
        args.scale = [int(x) for x in args.scale.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--scale: expected comma-separated request counts, got {args.scale!r}")
    try:
        args.scale_loads = [float(x) for x in args.scale_loads.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--scale-loads: expected comma-separated loads, got {args.scale_loads!r}")
    if not all(x > 0 for x in args.scale_loads):
        ap.error("--scale-loads: every load must be > 0")
    if args.requests < 1 or args.repeat < 1 or (args.load is not None and not args.load > 0) or args.million < 0 \
            or any(n < 1 for n in args.scale):
        ap.error("--requests, --repeat and --scale sizes must be >= 1, --load > 0 and --million >= 0")
    if args.fleet:
        return fleet_rows(args)
    with tempfile.TemporaryDirectory(prefix="bench-sim-") as folder:
        return bench(args, *tiled_trace(args.trace, args.requests, Path(folder)))


CASES = (("fcfs", "none", 1.0), ("countdown", "oracle", 1.0), ("countdown", "oracle", 2.0))


def timed_run(trace: str, policy: str, predictor: str, load: float, requests: int | None, kernel: str):
    """(summary, result) of one run; ``result.sim_cpu_s`` is the loop's CPU time."""
    prepared = prepare(RunConfig(trace=trace, predictor=predictor, policy=policy, load=load, requests=requests,
                                 kernel=kernel))
    return execute(prepared)


def bench(args, trace: str, trace_requests: int) -> int:
    tiled = f" (tiled from {trace_requests:,})" if trace != args.trace else ""
    kernels = ["reference"] + (["compiled"] if compiled_available() else [])
    print(f"trace {args.trace}, {args.requests} requests{tiled}, engine qwen3-8b-h100; "
          f"kernels: {', '.join(kernels)}")
    if "compiled" not in kernels:
        print("  compiled kernel unavailable (numba not installed): reference engine only")
    else:   # compile (or load from numba's cache) once before timing
        started = time.process_time()
        timed_run(trace, "countdown", "oracle", 1.0, min(args.requests, 50), "compiled")
        print(f"  compiled kernel: {time.process_time() - started:.1f} CPU-s to compile or load here")
        kernel_startup(trace, args.startup_cache)
    for policy, predictor, load in ([(p, q, args.load) for p, q, _ in CASES[:2]] if args.load else CASES):
        rates: dict[str, list[float]] = {k: [] for k in kernels}
        steps, peaks, finish = 0, [], {}
        for _ in range(args.repeat):
            for kernel in kernels:
                if kernel == "reference":
                    tracemalloc.start()
                    timed_run(trace, policy, predictor, load, args.requests, kernel)
                    peaks.append(tracemalloc.get_traced_memory()[1])
                    tracemalloc.stop()
                # tracemalloc slows Python; time a clean run for the rate
                summary, result = timed_run(trace, policy, predictor, load, args.requests, kernel)
                rates[kernel].append(summary["completed"] / result.sim_cpu_s)
                steps = result.steps
                finish[kernel] = result.finish_s.tobytes()
        ref = statistics.median(rates["reference"])
        print(f"  {policy:9s} + {predictor:6s} at {load:g}x: reference {ref:8.0f} requests/CPU-s "
              f"(min {min(rates['reference']):.0f}, max {max(rates['reference']):.0f}; {steps} steps, "
              f"{ref * steps / args.requests:,.0f} steps/CPU-s); peak traced memory {max(peaks) / 2**20:.1f} MiB")
        if "compiled" in kernels:
            comp = statistics.median(rates["compiled"])
            same = "identical finish times" if finish["compiled"] == finish["reference"] else "FINISH TIMES DIFFER"
            print(f"  {'':9s}   {'':6s}         compiled  {comp:8.0f} requests/CPU-s "
                  f"(min {min(rates['compiled']):.0f}, max {max(rates['compiled']):.0f}); "
                  f"{comp / ref:.1f}x the reference; {same}")
    if "compiled" in kernels and load_trace(args.trace).has_feature("feat_last"):
        hidden_state_cases(args)
    if "compiled" in kernels and load_trace(args.trace).has_feature("feat_last"):
        learned_predictor_rates(args)
    if "compiled" in kernels:
        pair_coverage()
    if "compiled" in kernels and args.scale:
        prepare_vs_loop(args)
    print(f"  process peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    if args.million:
        million(args)
    return 0


def hidden_state_cases(args) -> None:
    """LEAP on the recorded trace itself (not tiled: the hidden states are per request) at 1.5x:
    frozen leap, and leap-rls, whose online updates publish between compiled steps. The predictor's
    own work (its predictions, RLS updates and publishes: the same calls under both kernels) is
    timed apart, so the engine's share shows."""
    for predictor in ("leap", "leap-rls"):
        rates, share, engine_rates, finish = {}, {}, {}, {}
        for kernel in ("reference", "compiled"):
            runs = []
            for _ in range(args.repeat):
                prepared = prepare(RunConfig(trace=args.trace, predictor=predictor, policy="countdown", load=1.5,
                                             kernel=kernel))
                spent = time_predictor(prepared.simulation.predictor)
                summary, result = execute(prepared)
                runs.append((summary["completed"], result.sim_cpu_s, spent[0]))
                finish[kernel] = result.finish_s.tobytes()
            completed = runs[-1][0]
            rates[kernel] = statistics.median(c / cpu for c, cpu, _ in runs)
            share[kernel] = statistics.median(own / cpu for _, cpu, own in runs)
            engine_rates[kernel] = statistics.median(c / (cpu - own) for c, cpu, own in runs)
        same = "identical finish times" if finish["compiled"] == finish["reference"] else "FINISH TIMES DIFFER"
        print(f"  countdown + {predictor} at 1.5x ({args.trace} as recorded, {completed:,}): reference "
              f"{rates['reference']:8.0f}, compiled {rates['compiled']:8.0f} requests/CPU-s "
              f"({rates['compiled'] / rates['reference']:.1f}x); {same}")
        print(f"  {'':12s}the predictor's own calls: {share['reference']:.0%} of the reference loop, "
              f"{share['compiled']:.0%} of the compiled; the engine without them: reference "
              f"{engine_rates['reference']:,.0f}, compiled {engine_rates['compiled']:,.0f} requests/CPU-s")


#: the learned predictors on the recorded trace, with issue 24's targets (requests per CPU-second)
LEARNED = (("leap", 100_000), ("leap-rls", 50_000), ("trail", 20_000))


def learned_predictor_rates(args) -> None:
    """Countdown at 1.5x on the recorded trace, compiled: each learned predictor's rate beside the
    engine's own (the oracle, whose estimates cost nothing), its calls' share of the loop, its
    target, and a check against one reference run. Medians over --repeat runs."""
    from predictors.base import PredictorOptions

    def config(predictor: str, kernel: str) -> RunConfig:
        return RunConfig(trace=args.trace, predictor=predictor, policy="countdown", load=1.5, kernel=kernel,
                         predictor_options=PredictorOptions(refresh=True if predictor == "trail" else None))

    def runs(predictor: str):
        out = []
        for _ in range(args.repeat):
            prepared = prepare(config(predictor, "compiled"))
            spent = time_predictor(prepared.simulation.predictor)
            summary, result = execute(prepared)
            out.append((summary["completed"] / result.sim_cpu_s, spent[0] / result.sim_cpu_s, result))
        return statistics.median(r for r, _, _ in out), statistics.median(s for _, s, _ in out), out[-1][2]

    engine, _, _ = runs("oracle")
    print(f"  learned predictors, countdown at 1.5x ({args.trace} as recorded), compiled: the engine alone "
          f"(oracle) {engine:,.0f} req/CPU-s")
    for predictor, target in LEARNED:
        try:
            rate, share, result = runs(predictor)
        except (ValueError, OSError) as exc:   # no weights, no decode side table: say so, go on
            print(f"    {predictor:8s} skipped ({str(exc).splitlines()[0]})")
            continue
        _, reference = execute(prepare(config(predictor, "reference")))
        same = "identical to the reference" if reference.finish_s.tobytes() == result.finish_s.tobytes() \
            else "FINISH TIMES DIFFER from the reference"
        print(f"    {predictor:8s} {rate:9,.0f} req/CPU-s ({rate / engine:.0%} of the engine alone; target "
              f"{target:,}: {'met' if rate >= target else 'not met'}); its Python calls {share:.0%} of the loop "
              f"(work done in compiled code not counted); {same}")


def pair_coverage(trace_name: str = "lmsys", n: int = 48) -> None:
    """How many of the predictor x policy pairs the CLI accepts run on the compiled kernel (the
    kernel's own declarations, :func:`simulator.compiled.unsupported`, on ``n`` rows of a recorded
    trace), and why the others fall back to the reference engine, by reason."""
    from collections import Counter

    import numpy as np

    from policies import POLICIES, make_policy
    from predictors import PREDICTORS, make_predictor
    from simulator.compiled import unsupported
    from simulator.engine import Simulation
    from simulator.profiles import make_profile

    if trace_name not in bundled_trace_names():
        print(f"  per-pair coverage: skipped (no trace {trace_name!r})")
        return
    trace = load_trace(trace_name)
    workload = trace.take(np.arange(min(n, len(trace))))
    profile = make_profile("qwen3-8b-h100", trace)
    pairs = [(pred, pol) for pol, cls in POLICIES.items() for pred in ["none", *PREDICTORS]
             if not (pred == "none" and cls.uses_predictions)]
    outcome: Counter[str] = Counter()
    for pred, pol in pairs:
        try:
            sim = Simulation(workload, np.zeros(len(workload)), policy=make_policy(pol),
                             predictor=None if pred == "none" else make_predictor(pred), profile=profile)
        except (ValueError, OSError) as exc:   # no weights for this predictor here: say so, go on
            outcome[f"not built here ({str(exc).splitlines()[0]})"] += 1
            continue
        outcome[unsupported(sim) or "compiled"] += 1
    compiled = outcome.pop("compiled", 0)
    rest = "; the others use the reference engine:" if outcome else ""
    print(f"  per-pair coverage ({trace_name}, {len(workload)} rows): {compiled} of {len(pairs)} "
          f"predictor x policy pairs run compiled{rest}")
    for reason, count in outcome.most_common():
        print(f"    {count:3d}  {reason}")


def prepare_vs_loop(args) -> None:
    """Compiled runs of each --scale size of lengths-only requests (the trace tiled) at each
    --scale-loads load in this process (the kernel already compiled), with an empty capacity cache
    that the very first run fills (a tiled run's capacity is its trace's): CPU seconds of prepare
    and of the loop (medians of up to 3 runs), the simulated work per request (engine steps, queue
    wait) and how flat the cost per request is across sizes. At 1x (critical load) the queue grows
    with the run's length, so the simulated system itself differs by size; below it the system is
    the same at every size."""
    import os

    from core.trace import bundled_trace_names as bundled

    trace = "sharegpt-lengths" if "sharegpt-lengths" in bundled() else args.trace
    repeats = max(1, min(args.repeat, 3))
    before = os.environ.get("LEAP_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as cache:
        os.environ["LEAP_CACHE_DIR"] = cache
        try:
            for load in args.scale_loads:
                print(f"  prepare vs loop, {trace} tiled, FCFS at {load:g}x, compiled, median of {repeats} "
                      f"run(s) per size:")
                costs = [_scale_size(trace, n, load, repeats) for n in args.scale]
                if len(costs) > 1:
                    print(f"    cost per request in all, largest / smallest over the sizes: "
                          f"{max(costs) / min(costs):.2f}x (issue 24 asks <= 1.15x)")
        finally:
            if before is None:
                os.environ.pop("LEAP_CACHE_DIR", None)
            else:
                os.environ["LEAP_CACHE_DIR"] = before


def _scale_size(trace: str, n: int, load: float, repeats: int) -> float:
    """``repeats`` compiled runs of ``n`` tiled requests at ``load``; prints the medians, returns
    the median CPU-s per request (prepare and loop)."""
    import numpy as np

    prepares, loops = [], []
    for _ in range(repeats):
        started = time.process_time()
        prepared = prepare(RunConfig(trace=trace, tile=n, load=load, kernel="compiled"))
        prepares.append(time.process_time() - started)
        summary, result = execute(prepared)
        loops.append(result.sim_cpu_s)
    prepare_s, loop_s = statistics.median(prepares), statistics.median(loops)
    wait = float(np.mean(result.admit_s - result.arrival_s))
    first = (f" (first run's prepare {prepares[0]:.2f} CPU-s: it measured the capacity, cached after)"
             if prepares[0] > 3 * prepare_s + 0.01 else "")
    print(f"    {n:>9,}: prepare {prepare_s:7.2f} CPU-s, loop {loop_s:7.2f} CPU-s (prepare/loop "
          f"{prepare_s / loop_s:4.2f}); per request: prepare {prepare_s / n * 1e6:5.2f} us, "
          f"{(prepare_s + loop_s) / n * 1e6:5.2f} us in all, {n / (prepare_s + loop_s):,.0f} req/CPU-s; "
          f"simulated: {result.steps / n:.2f} steps per request, loop {loop_s / result.steps * 1e6:.2f} us per "
          f"step, mean queue wait {wait:.1f} s{first}")
    return (prepare_s + loop_s) / n


def time_predictor(predictor) -> list[float]:
    """Wrap the bound predictor's predict and feedback (and the publishes feedback returns) to sum
    their CPU time into the returned one-element list."""
    spent = [0.0]

    def timed(fn):
        def call(*a, **k):
            started = time.process_time()
            try:
                out = fn(*a, **k)
            finally:
                spent[0] += time.process_time() - started
            if out is not None and hasattr(out, "publish"):
                out.publish = timed(out.publish)
            return out
        return call

    predictor.predict = timed(predictor.predict)
    predictor.feedback = timed(predictor.feedback)
    if predictor.refresh_every:   # TRAIL's prefill observation and decode-time refreshes
        predictor.after_prefill = timed(predictor.after_prefill)
        predictor.refresh = timed(predictor.refresh)
    return spent


def compiled_available() -> bool:
    from simulator.compiled import load_kernel
    return load_kernel() is not None


def kernel_startup(trace: str, given: str | None = None) -> None:
    """The compiled kernel's start-up in two fresh processes sharing one empty numba cache: the
    first compiles and writes the cache, the second loads it. CPU seconds of a 50-request run's
    execution (the kernel's first call included; the run itself takes milliseconds). With
    ``given`` (--startup-cache) the two share that cache instead, and the line says so."""
    import os
    import subprocess

    code = (
        "import time, sys\n"
        "from simulator.runner import RunConfig, prepare, execute\n"
        f"p = prepare(RunConfig(trace={trace!r}, predictor='oracle', policy='countdown', load=1.0, requests=50, "
        "kernel='compiled'))\n"
        "t = time.process_time(); execute(p); print(time.process_time() - t)\n")
    seconds = []
    with tempfile.TemporaryDirectory(prefix="bench-numba-") as empty:
        env = dict(os.environ, NUMBA_CACHE_DIR=given or empty, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
        for _ in range(2):
            proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
            if proc.returncode != 0:
                print(f"  compiled kernel start-up: failed ({proc.stderr.strip().splitlines()[-1:]})")
                return
            seconds.append(float(proc.stdout.split()[-1]))
    if given:
        print(f"  compiled kernel start-up on the numba cache given (--startup-cache): first process "
              f"{seconds[0]:.1f} CPU-s, second {seconds[1]:.2f} CPU-s")
        return
    print(f"  compiled kernel start-up: first process {seconds[0]:.1f} CPU-s (compiles, writes numba's cache), "
          f"second {seconds[1]:.2f} CPU-s (loads it)")


def million(args) -> None:
    """One run of ``args.million`` lengths-only requests at 1x with the compiled kernel in a fresh
    process with an empty cache: CPU seconds from start-up (imports, trace tiling, capacity
    measurement, compilation) to the summary, and that process's peak RSS."""
    import os
    import subprocess

    code = (
        "import time, resource\n"
        "from simulator.runner import RunConfig, prepare, execute\n"
        f"s, r = execute(prepare(RunConfig(trace='sharegpt-lengths', tile={args.million}, load=1.0, "
        "kernel='compiled')))\n"
        "print(s['completed'], r.steps, r.sim_cpu_s, time.process_time(), "
        "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n")
    with tempfile.TemporaryDirectory(prefix="bench-cache-") as cache:
        env = dict(os.environ, LEAP_CACHE_DIR=cache, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        print(f"  {args.million:,} requests: failed ({proc.stderr.strip().splitlines()[-1:]})")
        return
    completed, steps, loop_s, total_s, rss = proc.stdout.split()
    print(f"  {int(completed):,} lengths-only requests at 1x, compiled: {float(total_s):.1f} CPU-s start-up "
          f"included (loop {float(loop_s):.1f} s, {int(steps):,} steps), peak RSS {int(rss) / 1024:.0f} MiB")


FLEET_RUN = (
    "import sys, time, resource\n"
    "from simulator.runner import RunConfig, prepare, execute\n"
    "r, n = int(sys.argv[1]), int(sys.argv[2])\n"
    "p = prepare(RunConfig(trace='sharegpt-lengths', tile=n, load=1.0, replicas=r, router='least-requests', "
    "kernel='compiled'))\n"
    "assert type(p.simulation).__name__ == ('CompiledFleet' if r > 1 else 'Simulation')\n"
    "s, res = execute(p)\n"
    "print(s['completed'], res.steps, res.sim_cpu_s, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n")


def fleet_rows(args) -> int:
    """The fleet rows: each run in a fresh process (its peak RSS its own; numba's cache warm)."""
    import os
    import subprocess

    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))

    def run(replicas: int, n: int) -> tuple[int, float, int] | None:
        proc = subprocess.run([sys.executable, "-c", FLEET_RUN, str(replicas), str(n)], capture_output=True,
                              text=True, env=env, check=False)
        if proc.returncode != 0:
            print(f"  {replicas} replicas x {n:,}: failed ({proc.stderr.strip().splitlines()[-1:]})")
            return None
        completed, _, loop_s, rss = proc.stdout.split()
        return int(completed), float(loop_s), int(rss)

    print("compiled fleet, sharegpt-lengths tiled, FCFS, least-requests, 1x capacity of the fleet")
    got = run(args.fleet, args.fleet_requests)
    if got is not None:
        completed, loop_s, rss = got
        print(f"  {args.fleet} replicas x {completed:,} requests: loop {loop_s:.1f} CPU-s, "
              f"{completed / loop_s:,.0f} req/CPU-s, peak RSS {rss / 1024:.0f} MiB")
    base = None
    for replicas in (1, 4, 16, 64):
        got = run(replicas, replicas * args.fleet_per_replica)
        if got is None:
            continue
        completed, loop_s, _ = got
        cost = loop_s / completed * 1e6
        base = base or cost
        print(f"  {replicas:>2} replicas x {args.fleet_per_replica:,} requests each: {cost:6.1f} us of loop "
              f"per request ({cost / base:.2f}x one replica's{', the single engine' if replicas == 1 else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
