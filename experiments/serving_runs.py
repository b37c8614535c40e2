"""Which serving runs go together (``traces/live/``): runs of one workload, the FCFS run a gain is
measured against, the run whose steps a replay's profile is fitted on, the finished runs of a folder.
Metadata queries only; nothing here replays a run (:mod:`experiments.serving_replay`)."""

from __future__ import annotations

import json

from core.trace import Trace, load_trace
from simulator.serving import is_serving
from simulator.serving import serving_meta as _serving
from simulator.stepclock import trace_clock

SIDE_TABLE_SUFFIXES = (".steps.parquet", ".sched.parquet", ".decode.parquet")


def serving_workload_key(trace: Trace) -> str:
    """Runs of the same workload on the same engine setting share this key (the live capacity's
    cache key: source requests, forced lengths, caps, token budget, threads; not the policy)."""
    s = _serving(trace)
    key = s.get("capacity_key")
    if key:
        return str(key)
    src = s.get("source_trace") or {}
    return json.dumps([src.get("sha256"), src.get("rows"), s.get("max_length"), s.get("forced_lengths"),
                       s.get("max_resident"), s.get("decode_slots"), s.get("wait_cap"),
                       s.get("max_num_batched_tokens")], sort_keys=True)


def serving_load(trace: Trace) -> float | None:
    s = _serving(trace)
    value = s.get("load")
    return float(value) if isinstance(value, (int, float)) else None


def _same_load(a: Trace, b: Trace) -> bool:
    la, lb = serving_load(a), serving_load(b)
    if la is not None and lb is not None:
        return abs(la - lb) < 1e-9
    ra, rb = _serving(a).get("rate_req_s"), _serving(b).get("rate_req_s")
    return la is None and lb is None and isinstance(ra, (int, float)) and isinstance(rb, (int, float)) \
        and abs(ra - rb) <= 1e-9 * max(abs(ra), 1.0)


def same_run(a: Trace, b: Trace) -> bool:
    """One and the same run (the same object, or the same file)."""
    if a is b:
        return True
    return a.path is not None and b.path is not None and a.path.resolve() == b.path.resolve()


def is_fcfs_run(trace: Trace) -> bool:
    s = _serving(trace)
    return s.get("policy") == "fcfs" and s.get("predictor", "none") == "none"


def fcfs_partner(trace: Trace, candidates: list[Trace], chosen: Trace | None = None) -> Trace | None:
    """The FCFS run of the same workload at the same load, among ``candidates`` (None if absent);
    ``chosen`` (``leap-validate --reference RUN``) is taken first when it is such a run."""
    key = serving_workload_key(trace)
    for c in ([chosen] if chosen is not None else []) + list(candidates):
        if not same_run(c, trace) and is_serving(c) and is_fcfs_run(c) and serving_workload_key(c) == key \
                and _same_load(c, trace):
            return c
    return None


def default_profile_source(trace: Trace, candidates: list[Trace]) -> Trace:
    """The serving run whose steps the profile is fitted on: another run of the same workload at
    the same load, the FCFS one first (so its steps cover the same range of batch sizes: a profile
    fitted at another load extrapolates, e.g. from mostly-full 16-decode steps at 1.3x to the
    4-8-decode steps of 0.8x); else a run at another load, FCFS first. Never the run itself."""
    key = serving_workload_key(trace)
    others = [c for c in candidates if is_serving(c) and not same_run(c, trace) and c.steps is not None
              and serving_workload_key(c) == key]
    ranked = sorted(others, key=lambda c: (not _same_load(c, trace), not is_fcfs_run(c), c.name))
    if not ranked:
        raise ValueError(f"trace {trace.name!r}: no other serving run of the same workload (with a steps "
                         "table) to fit the step profile on; give one with --profile-from")
    return ranked[0]


def serving_runs_in(folder) -> list[Trace]:
    """The finished seconds-clocked serving runs in a folder (traces/live/): runs still being recorded
    (a ``.parts`` folder beside them) and step-clocked runs (:mod:`experiments.validate_steps`) are left out."""
    from pathlib import Path

    folder = Path(folder)
    if not folder.is_dir():
        return []
    runs = []
    for p in sorted(folder.glob("*.parquet")):
        if p.name.endswith(SIDE_TABLE_SUFFIXES) or p.with_name(p.name + ".parts").exists():
            continue
        t = load_trace(p)
        if is_serving(t) and trace_clock(t) == "seconds":
            runs.append(t)
    return runs
