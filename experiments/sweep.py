"""Running many configurations: local worker processes (or Ray), one tidy results table.

Results are returned in configuration order whatever order the workers finish in, so a sweep's
table is as reproducible as a single run.

Stopping and resuming: SIGINT or SIGTERM stops a sweep within a second or two (workers ignore
Ctrl-C and die with their parent, even on ``kill -9``); runs already finished stay on disk. A run's
folder is complete once its ``summary.json`` is in place (written last, removed first when a run
is redone), and a later sweep into the same ``--out`` reuses it when its stored ``config.json``
equals the planned run's resolved configuration (trace and arrival content hashes, settings,
seed, code hash), so rerunning an interrupted command finishes only the missing runs.

Streaming: with ``--out``, the tidy ``results.parquet``/``results.csv`` are rewritten (atomically)
after every finished run, in configuration order, and only then is that run's ``summary.json``
written (by the sweep's own process, not the worker): so a stopped or even killed (``kill -9``)
sweep leaves a valid table that lists every complete run folder (and at most one more: the run
being marked when it was killed, which a rerun redoes).

Shipping: on Ray, the driver loads each trace once and puts it in the object store; a worker
process fetches it once (cached by content hash) and reuses it for every run it gets, instead of
reading and validating the file per run.
"""

from __future__ import annotations

import ctypes
import json
import math
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from contextlib import contextmanager
from pathlib import Path
from typing import cast

import pyarrow as pa

from core.io import TEMP_PATTERN, atomic_write_bytes, atomic_write_json, atomic_write_parquet
from core.trace import Trace, load_trace
from simulator.metrics import requests_table, simulated_only
from simulator.runner import Prepared, RunConfig, execute, prepare

EXECUTORS = ("local", "ray")
SUMMARY_FILE = "summary.json"   # written last: its presence marks a complete run folder
CONFIG_FILE = "config.json"
_PR_SET_PDEATHSIG = 1           # <linux/prctl.h>
#: How often a waiting sweep wakes to let a signal through. A signal may be delivered to any of
#: the process's threads (the pool's own included); the main thread, blocked on a lock until a run
#: finishes, would then see Ctrl-C only once the next run ends (never, with stuck workers).
SIGNAL_POLL_S = 0.2


class SweepInterrupted(Exception):
    """SIGINT/SIGTERM stopped a sweep; finished runs are kept. ``exit_code`` is 128 + the signal."""

    def __init__(self, finished: int, total: int, out: Path | None, signum: int):
        self.finished, self.total, self.out = finished, total, out
        self.exit_code = 128 + signum
        kept = f", kept in {out}" if out is not None and finished else ""
        super().__init__(f"interrupted: {finished} of {total} runs finished{kept}")


class Stopped(BaseException):
    """SIGTERM raised in the main thread, so that it takes Ctrl-C's path."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def run_slug(config: RunConfig) -> str:
    at = f"{config.load:g}x" if config.load is not None else config.arrivals.describe().replace(":", "")
    fleet = f"-{config.router}-x{config.replicas}" if config.replicas > 1 else ""
    return f"{config.predictor}-{config.policy}{fleet}-{at}-seed{config.seed}"


def planned_record(prepared: Prepared) -> dict:
    """What a run's ``config.json`` will hold, known before it runs (JSON-normalised for comparison)."""
    record = dict(prepared.resolved)
    return json.loads(json.dumps(record, sort_keys=True, allow_nan=False))


def completed_summary(config: RunConfig, target: str | Path, prepared: Prepared | None = None,
                      notify: Callable[[str], None] | None = None) -> dict | None:
    """The stored summary of ``target`` if it holds a complete run of exactly this configuration.
    A ``summary.json`` that is unreadable, or does not describe the run its folder holds (its run's
    names, seed, load and rates, and the request count of ``requests.parquet``), is not trusted:
    ``notify`` gets one line naming it, and the run is redone."""
    target = Path(target)
    if not (target / SUMMARY_FILE).exists():
        return None
    try:
        stored = json.loads((target / CONFIG_FILE).read_text())
    except (OSError, ValueError):
        stored = None
    prepared = prepared if prepared is not None else prepare(config)
    if stored != planned_record(prepared):
        return None   # another run's folder (or an older one): redone, as it always was
    try:
        summary = json.loads((target / SUMMARY_FILE).read_text())
        problem = summary_problem(summary, prepared, target)
    except (OSError, ValueError) as exc:
        problem = f"unreadable ({exc})"
    if problem is None:
        return summary
    if notify is not None:
        notify(f"{target / SUMMARY_FILE}: {problem}; the run is redone")
    return None


def summary_problem(summary, prepared: Prepared, target: Path) -> str | None:
    """Why a stored summary is not this run's (None: it is): its identity and counts are checked."""
    import pyarrow.parquet as pq

    if not isinstance(summary, dict):
        return "not a JSON object"
    cfg = prepared.config
    expected = {"trace": prepared.resolved["trace_name"], "predictor": cfg.predictor, "policy": cfg.policy,
                "engine": cfg.engine, "arrivals": cfg.arrivals.describe(), "load": cfg.load, "seed": cfg.seed,
                "charge_cost": cfg.charge_cost, "capacity_req_s": prepared.capacity_req_s,
                "arrival_rate_req_s": prepared.arrival_rate_req_s}
    for key, value in expected.items():
        if key not in summary or summary[key] != json.loads(json.dumps(value)):
            return f"field {key} is {summary.get(key, 'missing')!r}, the run's is {value!r}"
    rows = pq.read_metadata(target / "requests.parquet").num_rows
    arrived, completed = summary.get("arrived"), summary.get("completed")
    if arrived != rows or not isinstance(completed, int) or isinstance(completed, bool) or not 0 <= completed <= rows:
        return f"arrived {arrived!r} / completed {completed!r} do not match requests.parquet's {rows} requests"
    bad = next((k for k, v in summary.items() if isinstance(v, float) and not math.isfinite(v)), None)
    if bad is not None or not isinstance(summary.get("mean_ptl_s"), (int, float, type(None))):
        return f"field {bad or 'mean_ptl_s'} is not a number"
    return None


def run_one(config: RunConfig, out: str | None = None, prepared: Prepared | None = None,
            trace: Trace | None = None, mark: bool = True) -> dict:
    """Prepare (unless given; from ``trace`` when the caller has loaded it), run, optionally write
    the run's files; returns its summary. ``mark``: write ``summary.json`` (the mark of a complete
    run) too; a streaming sweep marks its runs itself, once its results table holds them."""
    prepared = prepared if prepared is not None else prepare(config, trace=trace)
    if out is not None:   # an old summary must not vouch for files being replaced
        (Path(out) / SUMMARY_FILE).unlink(missing_ok=True)
    summary, result = execute(prepared)
    if out is not None:
        target = Path(out)
        target.mkdir(parents=True, exist_ok=True)
        atomic_write_parquet(target / "requests.parquet", requests_table(result))
        atomic_write_json(target / CONFIG_FILE, prepared.resolved)
        if mark:
            mark_complete(target, summary)
    return summary


def mark_complete(target: Path, summary: dict) -> None:
    """The run folder's ``summary.json``, written last: its presence marks a complete run."""
    atomic_write_json(target / SUMMARY_FILE, simulated_only(summary))


def _worker_init(parent_pid: int) -> None:
    """Workers leave Ctrl-C to the parent (which stops them) and die with it, even on kill -9."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:   # the parent died before the death signal was armed
        os._exit(1)


@contextmanager
def sigterm_raises_stopped():
    """SIGTERM raises ``Stopped`` in the main thread for the duration, like Ctrl-C's KeyboardInterrupt."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise Stopped(signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def _signals_ignored():
    """A second Ctrl-C while workers are being stopped must not turn into a traceback."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


#: Per worker process: the trace shipped by the driver, by content hash (one sweep's at a time).
_SHIPPED: dict[str, Trace] = {}


def _run_shipped(config: RunConfig, out: str | None, key: str, box: list, mark: bool) -> tuple[dict, bool]:
    """A Ray task: the run, from the shipped trace (fetched once per worker process; the ref comes
    in a list so that Ray does not fetch it for every task). Returns (summary, fetched here)."""
    fetched = key not in _SHIPPED
    if fetched:
        import ray

        _SHIPPED.clear()
        _SHIPPED[key] = ray.get(box[0])
    return run_one(config, out, trace=_SHIPPED[key], mark=mark), fetched


def ship_form(trace: Trace) -> Trace:
    """The trace without what a process computed from it (Python id lists, feature matrices): only
    the Arrow table and metadata cross to the workers."""
    return Trace(name=trace.name, path=trace.path, table=trace.table, metadata=trace.metadata,
                 content_hash=trace.content_hash, steps=trace.steps, decode_path=trace.decode_path)


def _ray_run(configs, outs, todo, results, on_done, stats, mark):
    try:
        import ray
    except ImportError:
        raise ValueError("--executor ray needs Ray: pip install -e '.[ray]' (from the checkout)") from None
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=os.environ.get("RAY_ADDRESS"), include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
    refs = []
    try:
        remote = ray.remote(_run_shipped)
        shipped = {}   # config.trace -> (content hash, [object ref]): each trace put once
        for i in todo:
            if configs[i].trace not in shipped:
                trace = load_trace(configs[i].trace)
                shipped[configs[i].trace] = (trace.content_hash, [ray.put(ship_form(trace))])
        refs = [remote.remote(configs[i], outs[i], *shipped[configs[i].trace], mark) for i in todo]
        index = {ref: i for ref, i in zip(refs, todo)}
        pending = list(refs)
        stats["traces_shipped"] = len(shipped)
        stats["trace_fetches"] = 0
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=SIGNAL_POLL_S)
            for ref in done:
                results[index[ref]], fetched = ray.get(ref)
                stats["trace_fetches"] += fetched
                on_done(index[ref])
    except BaseException:
        with _signals_ignored():
            for ref in refs:
                try:
                    ray.cancel(ref, force=True)
                except Exception:   # already finished or gone
                    pass
        raise
    finally:
        if started_here:
            with _signals_ignored():
                ray.shutdown()


def _local_run(configs, outs, todo, results, jobs, on_done, mark):
    if jobs <= 1 or len(todo) <= 1:
        for i in todo:
            results[i] = run_one(configs[i], outs[i], mark=mark)
            on_done(i)
        return
    before = set(multiprocessing.active_children())
    pool = ProcessPoolExecutor(max_workers=min(jobs, len(todo)), initializer=_worker_init,
                               initargs=(os.getpid(),))
    try:
        futures = {pool.submit(run_one, configs[i], outs[i], mark=mark): i for i in todo}
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=SIGNAL_POLL_S, return_when=FIRST_COMPLETED)
            for future in done:
                results[futures[future]] = future.result()
                on_done(futures[future])
    except BaseException:   # interrupted or a run failed: stop the others now, not after they finish
        with _signals_ignored():
            workers = [p for p in multiprocessing.active_children() if p not in before]
            for p in workers:
                p.kill()
            pool.shutdown(wait=False, cancel_futures=True)
            for p in workers:
                p.join(timeout=5)
        raise
    pool.shutdown()


def _tidy_stopped(out: Path | None, outs: list[str | None], results: list) -> None:
    """A stopped sweep leaves no temp files (a signal can land inside an atomic write before its own
    clean-up, in a finished run's folder too) and no empty folders of unfinished runs."""
    folders = [Path(t) for t in outs if t is not None] + ([out] if out is not None else [])
    for folder in folders:
        for tmp in folder.glob(TEMP_PATTERN):
            tmp.unlink(missing_ok=True)
    for target, summary in zip(outs, results):
        if target is None or summary is not None:
            continue
        folder = Path(target)
        try:
            folder.rmdir()   # only when empty: a single run's --out may hold other files
        except OSError:
            pass


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class ResultsStream:
    """The tidy results table of a sweep kept current while it runs: each finished run's summary
    goes in, and ``results.parquet``/``results.csv`` are rewritten atomically (the finished runs in
    configuration order, relative changes among them) at once, before the run is marked complete,
    so a sweep stopped or killed at any moment leaves a valid table listing every complete run."""

    def __init__(self, out: Path):
        self.out = out
        self.finished: dict[int, dict] = {}
        self.written = 0          # runs in the table on disk

    def add(self, index: int, summary: dict) -> None:
        self.finished[index] = summary
        self.flush()

    def flush(self) -> None:
        if not self.finished or self.written == len(self.finished):
            return
        summaries = [dict(self.finished[i]) for i in sorted(self.finished)]
        add_relative_changes(summaries)
        write_results(self.out, summaries)
        self.written = len(summaries)


def run_many(configs: list[RunConfig], *, out: Path | None = None, jobs: int = 1, executor: str = "local",
             on_done: Callable[[], None] = lambda: None, prepared: list[Prepared] | Prepared | None = None,
             resume: bool = True, notify: Callable[[str], None] = _stderr,
             stats: dict | None = None) -> list[dict]:
    """Run every configuration; with ``out``, each run writes to ``out/<slug>/`` (or ``out`` if one).

    ``prepared`` (one per configuration, in order) are the caller's already prepared runs, used
    as they are (and released once run) so that a checked run is not built and bound twice; they
    run in this process, one after another. Without them, runs are prepared where they run (in
    the worker processes with ``jobs`` > 1). With ``resume``, a run whose folder already holds a
    complete run of the same resolved configuration is not run again: its stored summary is used
    (``notify`` gets one line saying how many). SIGINT/SIGTERM raise :class:`SweepInterrupted`
    after stopping the workers; finished runs stay on disk. With ``out`` and several configurations
    the results table streams (:class:`ResultsStream`). ``stats`` (Ray) receives
    ``traces_shipped`` and ``trace_fetches`` (worker processes that fetched a trace)."""
    # the caller's list itself: each slot is released (None) once run, so its state can be freed
    runs = cast("list[Prepared | None] | None", [prepared] if isinstance(prepared, Prepared) else prepared)
    if runs is not None and (len(runs) != len(configs)
                             or any(p is None or p.config != c for p, c in zip(runs, configs))):
        raise ValueError("run_many: prepared runs must match the configurations given, one each")
    if executor not in EXECUTORS:
        raise ValueError(f"unknown executor {executor!r} (choose from {', '.join(EXECUTORS)})")
    outs: list[str | None]
    if out is None:
        outs = [None] * len(configs)
    elif len(configs) == 1:
        outs = [str(out)]
    else:
        outs = [str(out / run_slug(c)) for c in configs]
    results: list[dict | None] = [None] * len(configs)
    stream = ResultsStream(out) if out is not None and len(configs) > 1 else None
    stats = stats if stats is not None else {}

    def finished(i: int, resumed: bool = False) -> None:
        result = results[i]
        if stream is not None and result is not None:
            stream.add(i, result)   # the table first, then the mark: the table never lists fewer runs
            if not resumed:
                mark_complete(Path(cast(str, outs[i])), result)
        on_done()

    try:
        with sigterm_raises_stopped():
            if resume and out is not None:
                for i, (config, target) in enumerate(zip(configs, outs)):
                    if target is not None:
                        results[i] = completed_summary(config, target, runs[i] if runs else None, notify)
                skipped = sum(r is not None for r in results)
                if skipped:
                    notify(f"skipped {skipped} of {len(configs)} runs already complete in {out} (same config)")
                    for i, r in enumerate(results):
                        if r is not None:
                            finished(i, resumed=True)
            todo = [i for i, r in enumerate(results) if r is None]
            mark = stream is None   # else finished() marks each run once the table holds it
            if executor == "ray":
                _ray_run(configs, outs, todo, results, finished, stats, mark)
            elif runs is not None:
                for i in todo:
                    run, runs[i] = runs[i], None   # released once run: its predictor's state is spent
                    results[i] = run_one(configs[i], outs[i], run, mark=mark)
                    finished(i)
            else:
                _local_run(configs, outs, todo, results, jobs, finished, mark)
            if stream is not None:
                stream.flush()
    except (KeyboardInterrupt, Stopped) as stop:
        signum = stop.signum if isinstance(stop, Stopped) else int(signal.SIGINT)
        with _signals_ignored():
            if stream is not None:
                stream.flush()
                for target, summary in zip(outs, results):   # stopped between the table and the mark
                    if summary is not None and not (Path(cast(str, target)) / SUMMARY_FILE).exists():
                        mark_complete(Path(cast(str, target)), summary)
            _tidy_stopped(out, outs, results)
        # a worker may have finished a run whose result had not reached this process yet
        done = sum(r is not None or (t is not None and (Path(t) / SUMMARY_FILE).exists())
                   for r, t in zip(results, outs))
        raise SweepInterrupted(done, len(configs), out, signum) from None
    return cast("list[dict]", results)   # every run finished: each slot holds its summary


CONFIG_COLUMNS = ("trace", "predictor", "policy", "engine", "arrivals", "load", "seed", "charge_cost")
#: a fleet's (runs of one engine have neither: their tables stay as they were)
FLEET_COLUMNS = ("router", "replicas")


def results_table(summaries: list[dict]) -> pa.Table:
    """One row per run: config columns first (a fleet's router and replicas after the policy), then
    every summary field (nulls where absent)."""
    config = list(CONFIG_COLUMNS)
    if any("router" in s for s in summaries):
        config[3:3] = FLEET_COLUMNS
    keys = config + sorted({k for s in summaries for k in s} - set(config))
    return pa.Table.from_pylist([{k: s.get(k) for k in keys} for s in summaries])


def write_results(out: Path, summaries: list[dict]) -> None:
    import io

    import pyarrow.csv as pacsv

    table = results_table([simulated_only(s) for s in summaries])
    atomic_write_parquet(out / "results.parquet", table)
    buffer = io.BytesIO()
    pacsv.write_csv(table, buffer)
    atomic_write_bytes(out / "results.csv", buffer.getvalue())


def add_relative_changes(summaries: list[dict], metric: str = "mean_ptl_s", reference_predictor: str = "leap") -> None:
    """Annotate each summary with its change in ``metric`` against FCFS and against LEAP (same load, seed)."""
    def key(s):   # the same fleet too: a router is compared with FCFS behind that router
        return (s["trace"], s["engine"], s["arrivals"], s["load"], s["seed"], s.get("router"), s.get("replicas"))

    fcfs = {key(s): s.get(metric) for s in summaries if s["predictor"] == "none" and s["policy"] == "fcfs"}
    ref = {(key(s), s["policy"]): s.get(metric) for s in summaries if s["predictor"] == reference_predictor}
    for s in summaries:
        value = s.get(metric)
        base = fcfs.get(key(s))
        s[f"vs_fcfs_{metric}"] = (value - base) / base if value is not None and base else None
        lp = ref.get((key(s), s["policy"]))
        s[f"vs_{reference_predictor}_{metric}"] = (value - lp) / lp if value is not None and lp else None
