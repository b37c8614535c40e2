"""Where a compiled frozen-``leap`` run's CPU goes, beside the oracle's (issue 24, item 2).

Countdown at 1.5x on a trace with hidden states (``sharegpt`` as recorded by default), compiled
kernel, all in one process:

- counts: engine steps, the kernel's returns to Python by status, prefill estimates published in
  compiled code (:mod:`simulator.kernel_estimates`) and in Python, the kernel's re-keys (linear, or
  a full re-sort above ``REKEY_RESORT`` rows), and from the step log: residents, steps with rows
  forced by the wait cap, admitting steps;
- times: medians over --repeat runs (round robin) of the loop's CPU (``sim_cpu_s``) for the oracle,
  ``leap``, ``leap``'s schedule replayed with its estimates fixed from the start (nothing to
  publish: the same steps, checked by its finish times, so ``leap`` minus it is the publishing and
  ``it`` minus the oracle is the simulated system), and the oracle with admission by row (as a
  prefill-stage predictor's is).

    python benchmarks/bench_leap_breakdown.py [--trace sharegpt] [--requests N] [--repeat 5] [--wait-cap 128]

The two replays beside the real runs are what-ifs built by this script (not CLI configurations).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from simulator import compiled, kernel_layout  # noqa: E402
from simulator.config import EngineConfig  # noqa: E402
from simulator.kernel_layout import PRED_STATIC, REKEY_RESORT  # noqa: E402
from simulator.runner import RunConfig, execute, prepare  # noqa: E402

#: the kernel's exit statuses by value, named as simulator.kernel_layout defines them
STATUS = {getattr(kernel_layout, name): name
          for name in ("DONE_OR_CHUNK", "STALLED", "NEEDS_SCORES", "AFTER_STEP", "NEEDS_EVENT")}
#: the replays: (predictor, what-if) with what-if None (the run itself), "fixed" or "by row"
CASES = (("oracle", None), ("leap", None), ("leap", "fixed"), ("oracle", "by row"))
LABELS = {None: "", "fixed": " (estimates fixed from the start, nothing published)",
          "by row": " (admission by row, as leap's)"}


class Probe:
    """Wraps :class:`simulator.compiled.CompiledRun` to count its kernel calls and publishes, and to
    build the what-if replays."""

    def __init__(self):
        self.what_if: str | None = None
        self.counting = False
        self.counts: Counter = Counter()
        self.python_publish_steps: list[int] = []
        run = compiled.CompiledRun
        self.init, self.advance, self.predict = run.__init__, run.advance, run.predict_after_prefill
        probe = self

        def init(run, sim, table, driver):
            probe.init(run, sim, table, driver)
            probe.what_if_settings(run, table)

        def advance(run, max_steps):
            return probe.counted_advance(run, max_steps)

        def predict_after_prefill(run):
            pending = len(run.pending)
            probe.predict(run)
            if probe.counting:
                probe.counts["Python publishes" if len(run.pending) == pending else "late estimates (SimPy events)"] += 1
                probe.python_publish_steps.append(run.steps - 1)

        for name, wrapper in (("__init__", init), ("advance", advance), ("predict_after_prefill", predict_after_prefill)):
            setattr(run, name, wrapper)

    def what_if_settings(self, run, table) -> None:
        if self.what_if == "fixed" and run.publishing is not None:
            estimates = run.publishing[0]   # in place before each row's first decode, as leap's on-time publish
            run.publishing, run.mode = None, PRED_STATIC
            table.predicted[:] = estimates
            run.settings = run.settings._replace(pred_mode=PRED_STATIC)
        elif self.what_if == "by row":
            run.settings = run.settings._replace(ordered=False)
        run.kernel_args = (run.rows, run.work, run.settings, run.state, run.batch)

    def counted_advance(self, run, max_steps: int) -> int:
        if not self.counting or max_steps == 0:
            return self.advance(run, max_steps)
        waiting = int(run.st.n_rekey)   # published by Python since the last call: taken in this one
        if waiting:
            self.counts["re-keys taken from Python's publishes"] += 1
            self.counts["  of which full re-sorts"] += waiting > REKEY_RESORT
        done = self.advance(run, max_steps)
        self.counts["kernel calls from Python"] += 1
        self.counts["  returned " + STATUS[int(run.st.status)]] += 1
        return done


def config(args, predictor: str) -> RunConfig:
    return RunConfig(trace=args.trace, predictor=predictor, policy="countdown", load=1.5, kernel="compiled",
                     requests=args.requests, engine_config=EngineConfig(wait_cap=args.wait_cap))


def replay(args, probe: Probe, predictor: str, what_if: str | None, record_steps: bool = False):
    probe.what_if = what_if
    try:
        return execute(prepare(config(args, predictor), record_steps=record_steps))
    finally:
        probe.what_if = None


def counts(args, probe: Probe) -> None:
    for predictor, what_if in (("oracle", None), ("leap", None), ("oracle", "by row")):
        probe.counts.clear()
        probe.python_publish_steps.clear()
        probe.counting = True
        summary, result = replay(args, probe, predictor, what_if)
        probe.counting = False
        _, logged = replay(args, probe, predictor, what_if, record_steps=True)
        assert logged.finish_s.tobytes() == result.finish_s.tobytes(), "the step log changed the run"
        print(f"{predictor}{LABELS[what_if]}: {summary['completed']:,} requests, {result.steps:,} engine steps")
        for name, n in sorted(probe.counts.items(), key=lambda kv: kv[0].lstrip()):
            print(f"    {name:44s} {n:,}")
        firsts = np.bincount(result.first_token_step, minlength=result.steps)   # rows per step (not the step clock)
        prefilling = np.flatnonzero(firsts)
        print(f"    {'steps with first tokens':44s} {len(prefilling):,} ({firsts[prefilling].mean():.2f} rows each, "
              f"max {firsts.max()})")
        if predictor == "leap":
            in_kernel = np.setdiff1d(prefilling, probe.python_publish_steps)
            rows = firsts[in_kernel]
            print(f"    {'publishes in compiled code':44s} {len(in_kernel):,} steps ({rows.sum():,} rows); re-keys: "
                  f"{int((rows <= REKEY_RESORT).sum()):,} linear, {int((rows > REKEY_RESORT).sum()):,} full re-sorts")
        log = logged.step_log.as_arrays()
        print(f"    step log: residents mean {log['resident'].mean():.1f} (max {log['resident'].max()}), decoded "
              f"mean {log['decoded'].mean():.1f}, steps with forced rows {int((log['forced'] > 0).sum()):,} "
              f"({int(log['forced'].sum()):,} forced), admitting steps {int((log['admitted'] > 0).sum()):,}")


def times(args, probe: Probe) -> None:
    for predictor, what_if in CASES:   # warm-up: the publishing kernel compiles in every process
        replay(args, probe, predictor, what_if)
    runs: dict = {case: [] for case in CASES}
    finish = {}
    for _ in range(args.repeat):
        for case in CASES:
            summary, result = replay(args, probe, *case)
            runs[case].append((summary["completed"] / result.sim_cpu_s, result.sim_cpu_s, result.steps))
            finish[case] = result.finish_s.tobytes()
    oracle = statistics.median(r for r, _, _ in runs[CASES[0]])
    for (predictor, what_if), out in runs.items():
        rate, cpu = statistics.median(r for r, _, _ in out), statistics.median(c for _, c, _ in out)
        print(f"{predictor + LABELS[what_if]:62s} {rate:9,.0f} req/CPU-s ({rate / oracle:4.2f} of the oracle's), "
              f"loop {cpu * 1e3:6.2f} ms, {cpu / out[0][2] * 1e6:4.2f} us/step over {out[0][2]:,} steps")
    same = finish[("leap", None)] == finish[("leap", "fixed")]
    print(f"leap and its fixed-estimates replay: {'identical finish times' if same else 'FINISH TIMES DIFFER'}; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="sharegpt", help="a trace with the hidden states leap reads")
    ap.add_argument("--requests", type=int, default=None, help="the trace's first N requests (default: all)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--wait-cap", type=int, default=EngineConfig().wait_cap, help="0: no forcing (a what-if)")
    args = ap.parse_args()
    if args.repeat < 1 or (args.requests is not None and args.requests < 1) or args.wait_cap < 0:
        ap.error("--repeat and --requests must be >= 1, --wait-cap >= 0")
    if compiled.load_kernel() is None:
        print("compiled kernel unavailable (numba is not installed): nothing to break down")
        return 0
    try:   # no such trace, no hidden states, no read-out: one line, before any run
        prepare(config(args, "leap"))
    except (ValueError, OSError) as exc:
        print(f"bench_leap_breakdown: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    probe = Probe()
    counts(args, probe)
    times(args, probe)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
