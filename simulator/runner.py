"""One run's configuration, validated on construction, and the function that runs it."""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable

import numpy as np

from policies import make_policy
from predictors import make_predictor
from predictors.base import PredictorOptions
from simulator.engine import EngineConfig, RunResult, Simulation
from simulator.metrics import summarize
from simulator.profiles import DEFAULT_PROFILE, make_profile
from simulator.trace import Trace, load_trace, trace_reference
from simulator.workload import ArrivalSpec, make_arrivals, measure_capacity

NO_PREDICTOR = "none"
#: Largest seed: results tables store it as a Parquet int64.
MAX_SEED = 2**63 - 1
_CODE_PACKAGES = ("simulator", "policies", "predictors")


@lru_cache(maxsize=1)
def code_hash() -> str:
    """SHA-256 of the simulator's source and shipped weights: a stored run is only reused by a sweep
    (``--out`` resume) when the code that would redo it is the same."""
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    files = sorted(p for pkg in _CODE_PACKAGES for p in (root / pkg).rglob("*")
                   if p.is_file() and (p.suffix in (".py", ".npz") or p.name == "MANIFEST")
                   and "__pycache__" not in p.parts)
    for path in files:
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


@dataclass(frozen=True)
class RunConfig:
    """Everything that determines a run's output (same config + seed -> identical bytes)."""

    trace: str
    predictor: str = NO_PREDICTOR
    policy: str = "fcfs"
    engine: str = DEFAULT_PROFILE
    load: float = 1.0
    arrivals: ArrivalSpec = field(default_factory=ArrivalSpec)
    requests: int | None = None
    seed: int = 0
    engine_config: EngineConfig = field(default_factory=EngineConfig)
    predictor_options: PredictorOptions = field(default_factory=PredictorOptions)
    charge_cost: bool = True

    def __post_init__(self) -> None:
        if not np.isfinite(self.load) or self.load <= 0:
            raise ValueError(f"load must be a positive multiple of capacity, got {self.load}")
        if self.requests is not None and self.requests < 1:
            raise ValueError(f"--requests must be >= 1, got {self.requests}")
        if not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"--seed must be between 0 and 2**63 - 1 (stored as int64), got {self.seed}")

    def describe(self) -> dict:
        d = asdict(self)
        d["arrivals"] = self.arrivals.describe()
        d["trace"] = trace_reference(self.trace)        # no absolute paths in shared outputs
        d["predictor_options"]["train_trace"] = trace_reference(self.predictor_options.train_trace)
        return d


@dataclass
class Prepared:
    """A run with every input resolved and checked, ready to simulate."""

    config: RunConfig
    workload: Trace
    simulation: Simulation
    capacity_req_s: float
    arrival_rate_req_s: float
    resolved: dict


def prepare(config: RunConfig, progress: Callable[[int, int], None] | None = None,
            record_steps: bool = False) -> Prepared:
    """Load, validate and build everything; raises TraceError/ValueError before any output."""
    trace = load_trace(config.trace)
    workload = trace if config.requests is None else trace.take(np.arange(min(config.requests, len(trace))))
    if config.requests is not None and config.requests > len(trace):
        raise ValueError(f"--requests {config.requests}: trace {trace.name!r} has only {len(trace)} requests")
    policy = make_policy(config.policy)
    predictor = None if config.predictor == NO_PREDICTOR else make_predictor(config.predictor, config.predictor_options)
    if predictor is None and policy.uses_predictions:
        raise ValueError(f"policy {config.policy!r} needs a predictor (--predictor)")
    if predictor is not None:   # train or load now, so a bad training trace fails before any output
        predictor.bind(workload, np.random.default_rng(config.seed))
    profile = make_profile(config.engine, trace)
    capacity = measure_capacity(workload, profile, config.engine_config)
    rate = config.load * capacity
    arrival_s = make_arrivals(config.arrivals, workload, rate, config.seed)
    sim = Simulation(workload, arrival_s, policy=policy, predictor=predictor, profile=profile,
                     config=config.engine_config, seed=config.seed, charge_cost=config.charge_cost,
                     record_steps=record_steps, progress=progress)
    resolved = {
        **config.describe(),
        "trace_name": trace.name,
        "trace_hash": trace.content_hash,
        "trace_path": trace_reference(trace.path) if trace.path else None,
        "requests_used": len(workload),
        "policy_settings": policy.describe(),
        "engine_settings": profile.describe(),
        "capacity_req_s": capacity,
        "arrival_rate_req_s": rate,
        "arrivals_hash": hashlib.sha256(np.ascontiguousarray(arrival_s, dtype=np.float64).tobytes()).hexdigest(),
        "code_hash": code_hash(),
    }
    return Prepared(config, workload, sim, capacity, rate, resolved)


def execute(prepared: Prepared) -> tuple[dict, RunResult]:
    """Run a prepared simulation and summarise it."""
    result = prepared.simulation.run()
    predictor = prepared.simulation.predictor
    if predictor is not None:
        prepared.resolved["predictor_settings"] = predictor.describe()
    cfg = prepared.config
    summary = summarize(
        result,
        trace=prepared.resolved["trace_name"],
        predictor=cfg.predictor,
        policy=cfg.policy,
        engine=cfg.engine,
        arrivals=cfg.arrivals.describe(),
        load=cfg.load,
        seed=cfg.seed,
        charge_cost=cfg.charge_cost,
        arrival_rate_req_s=prepared.arrival_rate_req_s,
        capacity_req_s=prepared.capacity_req_s,
    )
    return summary, result
