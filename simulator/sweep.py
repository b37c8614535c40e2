"""Running many configurations: local worker processes (or Ray), one tidy results table.

Results are returned in configuration order whatever order the workers finish in, so a sweep's
table is as reproducible as a single run.
"""

from __future__ import annotations

import os
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Callable

import pyarrow as pa

from simulator.io import atomic_write_bytes, atomic_write_json, atomic_write_parquet
from simulator.metrics import requests_table, simulated_only
from simulator.runner import Prepared, RunConfig, execute, prepare

EXECUTORS = ("local", "ray")


def run_slug(config: RunConfig) -> str:
    at = f"{config.load:g}x" if config.load is not None else config.arrivals.describe().replace(":", "")
    return f"{config.predictor}-{config.policy}-{at}-seed{config.seed}"


def run_one(config: RunConfig, out: str | None = None, prepared: Prepared | None = None) -> dict:
    """Prepare (unless given), run, optionally write the run's files; returns its summary."""
    prepared = prepared if prepared is not None else prepare(config)
    summary, result = execute(prepared)
    if out is not None:
        target = Path(out)
        target.mkdir(parents=True, exist_ok=True)
        atomic_write_parquet(target / "requests.parquet", requests_table(result))
        atomic_write_json(target / "config.json", prepared.resolved)
        atomic_write_json(target / "summary.json", simulated_only(summary))
    return summary


def _ray_run(configs, outs, on_done):
    try:
        import ray
    except ImportError:
        raise ValueError("--executor ray needs Ray: pip install 'leap-sched[ray]'") from None
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=os.environ.get("RAY_ADDRESS"), include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
    try:
        remote = ray.remote(run_one)
        refs = [remote.remote(c, o) for c, o in zip(configs, outs)]
        index = {ref: i for i, ref in enumerate(refs)}
        results: list = [None] * len(refs)
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                results[index[ref]] = ray.get(ref)
                on_done()
        return results
    finally:
        if started_here:
            ray.shutdown()


def run_many(configs: list[RunConfig], *, out: Path | None = None, jobs: int = 1, executor: str = "local",
             on_done: Callable[[], None] = lambda: None, prepared: Prepared | None = None) -> list[dict]:
    """Run every configuration; with ``out``, each run writes to ``out/<slug>/`` (or ``out`` if one).

    ``prepared`` (a single configuration only) is the caller's already prepared run, used as is
    so that a checked run is not built twice."""
    if prepared is not None and (len(configs) != 1 or prepared.config != configs[0]):
        raise ValueError("run_many: prepared must belong to the single configuration given")
    if executor not in EXECUTORS:
        raise ValueError(f"unknown executor {executor!r} (choose from {', '.join(EXECUTORS)})")
    if out is None:
        outs = [None] * len(configs)
    elif len(configs) == 1:
        outs = [str(out)]
    else:
        outs = [str(out / run_slug(c)) for c in configs]
    if executor == "ray":
        return _ray_run(configs, outs, on_done)
    if prepared is not None:
        summary = run_one(configs[0], outs[0], prepared)
        on_done()
        return [summary]
    if jobs <= 1 or len(configs) == 1:
        results = []
        for config, target in zip(configs, outs):
            results.append(run_one(config, target))
            on_done()
        return results
    results = [None] * len(configs)
    with ProcessPoolExecutor(max_workers=min(jobs, len(configs))) as pool:
        futures = {pool.submit(run_one, c, o): i for i, (c, o) in enumerate(zip(configs, outs))}
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                results[futures[future]] = future.result()
                on_done()
    return results


CONFIG_COLUMNS = ("trace", "predictor", "policy", "engine", "arrivals", "load", "seed", "charge_cost")


def results_table(summaries: list[dict]) -> pa.Table:
    """One row per run: config columns first, then every summary field (nulls where absent)."""
    keys = list(CONFIG_COLUMNS) + sorted({k for s in summaries for k in s} - set(CONFIG_COLUMNS))
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
    def key(s):
        return (s["trace"], s["engine"], s["arrivals"], s["load"], s["seed"])

    fcfs = {key(s): s.get(metric) for s in summaries if s["predictor"] == "none" and s["policy"] == "fcfs"}
    ref = {(key(s), s["policy"]): s.get(metric) for s in summaries if s["predictor"] == reference_predictor}
    for s in summaries:
        value = s.get(metric)
        base = fcfs.get(key(s))
        s[f"vs_fcfs_{metric}"] = (value - base) / base if value is not None and base else None
        lp = ref.get((key(s), s["policy"]))
        s[f"vs_{reference_predictor}_{metric}"] = (value - lp) / lp if value is not None and lp else None
