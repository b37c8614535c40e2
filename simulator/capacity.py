"""The capacity a load multiple is measured against: steady-state saturated FCFS throughput of a
(workload, engine) pair, measured by the runner once per pair and cached on disk."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import numpy as np

from core.capacity_cache import cache_key, cache_path, read_entry, write_entry
from core.trace import Trace
from policies.fcfs import FCFS
from simulator.engine import RunResult, Simulation

CAPACITY_DEFINITION = ("steady-state saturated FCFS: a seeded shuffle of the workload repeated to at least "
                       "8 x max_resident requests, all queued at t=0; completions per second between the "
                       "max_resident-th completion and the moment the queue empties")
#: The capacity stream: at least this many times max_resident requests, so that the measured
#: window (after one resident generation of warm-up, before the drain) spans several generations.
CAPACITY_STREAM_PER_RESIDENT = 8
CAPACITY_STREAM_SEED = 0
#: The simulator's capacity cache file (``core.capacity_cache``).
CAPACITY_FILE = "capacity.json"


#: The engine's modules: a cached capacity is stale once one of them changes.
ENGINE_MODULES = ("engine", "config", "requests", "scheduler", "kv_blocks", "prefix_cache", "prediction")


def _code_version() -> str:
    """Hash of the engine, profile and hardware-constant sources: a cached capacity is stale once
    they change."""
    root = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in [*(root / f"{name}.py" for name in ENGINE_MODULES), *sorted((root / "profiles").glob("*.py")),
                 root.parent / "core" / "hardware.py"]:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def capacity_stream(workload: Trace, max_resident: int) -> np.ndarray:
    """Rows of the capacity stream: whole shuffled copies of the workload (fixed seed), cut to
    max(n, 8 x max_resident) requests. Every request appears equally often (up to the last, partial
    copy), so a trace and the same trace tiled measure the same mix."""
    n = len(workload)
    size = max(n, CAPACITY_STREAM_PER_RESIDENT * max_resident)
    rng = np.random.default_rng(CAPACITY_STREAM_SEED)
    copies = -(-size // n)
    return np.concatenate([rng.permutation(n) for _ in range(copies)])[:size]


def saturated_throughput(admit_s: np.ndarray, finish_s: np.ndarray, warmup: int) -> float:
    """Completions per second while the engine is saturated: from the ``warmup``-th completion
    (the first resident generation, admitted together, finishes shortest-first) to the last
    admission (after it the queue is empty and the engine drains, a tail set by the longest
    requests). Falls back to completions / makespan when that window holds too few completions."""
    finish = np.sort(finish_s)
    end = int(np.searchsorted(finish, float(np.max(admit_s)), side="right"))
    start = min(warmup, len(finish))
    if end - start >= 2 and finish[end - 1] > finish[start - 1 if start else 0]:
        first = finish[start - 1] if start else 0.0
        return (end - start) / (finish[end - 1] - first)
    return len(finish) / float(finish[-1])


def capacity_key(workload: Trace, profile_desc: dict, config_desc: dict) -> str:
    stream = len(capacity_stream(workload, int(config_desc.get("max_resident", 1))))
    return cache_key({"trace": workload.content_hash, "n": len(workload), "stream": stream, "profile": profile_desc,
                      "engine": config_desc, "definition": CAPACITY_DEFINITION, "code": _code_version()})


def measure_capacity(workload: Trace, profile, config,
                     run: Callable[[Simulation], RunResult] = Simulation.run) -> float:
    """Steady-state saturated FCFS throughput (req/s) of this workload's mix on this engine,
    cached on disk (see :data:`CAPACITY_DEFINITION`). Measured on a long stream resampled from the
    workload, so that it does not depend on the trace's size or its longest request. ``run``: how the
    measuring simulation runs (the runner's choice of kernel; the compiled one gives the same bytes)."""
    key = capacity_key(workload, profile.describe(), asdict(config))
    path = cache_path(CAPACITY_FILE)
    cached = read_entry(path, key)
    if cached is not None:
        return float(cached["capacity_req_s"])
    rows = capacity_stream(workload, config.max_resident)
    stream = workload.take(rows)
    # queued at once, in stream order: arrival offsets far below one step keep that order
    arrival = np.arange(len(rows)) * 1e-9
    result = run(Simulation(stream, arrival, policy=FCFS(), predictor=None, profile=profile, config=config))
    capacity = float(saturated_throughput(result.admit_s, result.finish_s, config.max_resident))
    write_entry(path, key, {"capacity_req_s": capacity, "trace": workload.name, "requests": len(workload),
                            "stream_requests": len(rows), "engine": profile.describe().get("name"),
                            "definition": CAPACITY_DEFINITION})
    return capacity
