"""One run's configuration, validated on construction, and the function that runs it."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from core.hardware import kv_blocks_in_memory
from core.latency import parse_goodput
from core.trace import Trace, load_trace, tile_trace, trace_reference
from policies import make_policy
from predictors import NO_PREDICTOR, make_predictor
from predictors.base import PredictorOptions
from predictors.gpu_cost import describe_cost
from routers import DEFAULT_ROUTER, check_router, check_router_cache, make_router
from simulator.capacity import measure_capacity
from simulator.compiled import DEFAULT_KERNEL, KERNELS, CompiledRun, note_fallback, unsupported
from simulator.compiled_fleet import CompiledFleet, fleet_unsupported
from simulator.config import KV_BLOCKS_FROM_PROFILE
from simulator.engine import EngineConfig, RunResult, Simulation, check_kv_blocks
from simulator.fleet import FleetSimulation
from simulator.metrics import summarize
from simulator.pd_config import PD_FIELDS, check_pd, fleet_size, prepared_pd
from simulator.pd_link import DEFAULT_KV_LINK_GBPS, DEFAULT_KV_LINK_LATENCY_MS
from simulator.preset import recorded_engine_config, recorded_window
from simulator.profiles import DEFAULT_PROFILE, make_profile
from simulator.serving import is_serving, with_source_features
from simulator.workload import ArrivalSpec, make_arrivals

#: Largest seed: results tables store it as a Parquet int64.
MAX_SEED = 2**63 - 1
_CODE_PACKAGES = ("core", "policies", "predictors", "routers", "simulator")


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


PRESETS = ("recorded",)
ENGINE_FIELDS = tuple(f.name for f in fields(EngineConfig))


@dataclass(frozen=True)
class RunConfig:
    """Everything that determines a run's output (same config + seed -> identical bytes).

    ``load`` is a multiple of the measured FCFS capacity for rate-driven arrivals, and None for
    arrivals replayed as recorded (``recorded``, ``closed[:N]``), which need no capacity. With
    ``preset="recorded"`` the engine settings come from the trace's metadata and
    ``engine_overrides`` (field, value) pairs replace some of them; ``engine_config`` is unused."""

    trace: str
    predictor: str = NO_PREDICTOR
    policy: str = "fcfs"
    engine: str = DEFAULT_PROFILE
    load: float | None = 1.0
    arrivals: ArrivalSpec = field(default_factory=ArrivalSpec)
    requests: int | None = None
    seed: int = 0
    tile: int | None = None             # repeat the trace to this many requests first (scaling studies)
    engine_config: EngineConfig = field(default_factory=EngineConfig)
    predictor_options: PredictorOptions = field(default_factory=PredictorOptions)
    charge_cost: bool = True
    preset: str | None = None
    engine_overrides: tuple[tuple[str, Any], ...] = ()
    # the engine's implementation (the compiled step, or the reference SimPy loop that defines it, which
    # a configuration the kernel does not cover falls back to); outputs are identical (not recorded)
    kernel: str = DEFAULT_KERNEL
    # a fleet (docs/semantics.md "Fleets"): this many replicas of the engine behind this router
    replicas: int = 1
    router: str = DEFAULT_ROUTER
    # goodput SLOs in ms (``--goodput``, core.latency.SLO_METRICS): they add request_goodput to the summary
    goodput: tuple[tuple[str, float], ...] = ()
    # the policy's own settings (``--setting POLICY.KEY=VALUE``, policies/settings.py), typed, sorted by key
    policy_options: tuple[tuple[str, Any], ...] = ()
    # a prefill/decode fleet (docs/semantics.md "Prefill/decode disaggregation"; 0: none): P prefill
    # and D decode instances, the decode router, the KV link (simulator.pd_link)
    prefill_replicas: int = 0
    decode_replicas: int = 0
    decode_router: str | None = None
    kv_link_gbps: float = DEFAULT_KV_LINK_GBPS
    kv_link_latency_ms: float = DEFAULT_KV_LINK_LATENCY_MS

    def __post_init__(self) -> None:
        check_fleet(self.replicas, self.router, self.predictor, self.arrivals)
        check_pd(self)
        if self.kernel not in KERNELS:
            raise ValueError(f"unknown kernel {self.kernel!r} (known: {', '.join(KERNELS)})")
        if self.arrivals.as_recorded:
            if self.load is not None:
                raise ValueError(f"--load does not apply to --arrivals {self.arrivals.describe()}: requests are "
                                 "replayed as recorded, no capacity is measured")
        elif self.load is None or not np.isfinite(self.load) or self.load <= 0:
            raise ValueError(f"load must be a positive multiple of capacity, got {self.load}")
        if self.arrivals.step_clock and self.engine != "unit":
            raise ValueError(f"--arrivals steps runs the step clock: every step lasts 1.0 (--engine unit), "
                             f"not --engine {self.engine}")
        if self.arrivals.step_clock and self.charge_cost:
            raise ValueError("--arrivals steps runs the step clock: no predictor cost is charged "
                             "(--predictor-cost none)")
        if self.requests is not None and self.requests < 1:
            raise ValueError(f"--requests must be >= 1, got {self.requests}")
        if self.tile is not None and self.tile < 1:
            raise ValueError(f"--tile must be >= 1, got {self.tile}")
        if not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"--seed must be between 0 and 2**63 - 1 (stored as int64), got {self.seed}")
        if self.preset is not None and self.preset not in PRESETS:
            raise ValueError(f"unknown --preset {self.preset!r} (choose from {', '.join(PRESETS)})")
        if self.engine_overrides and self.preset is None:
            raise ValueError("engine_overrides apply to a preset; without one set engine_config")
        for name, _ in self.engine_overrides:
            if name not in ENGINE_FIELDS:
                raise ValueError(f"unknown engine setting {name!r}")
        parse_goodput([f"{name}:{ms}" for name, ms in self.goodput])   # refuses an unknown SLO or a bad value

    def engine_config_for(self, trace: Trace) -> EngineConfig:
        """The engine settings of this run on ``trace`` (a preset read from its metadata, then overrides)."""
        if self.preset is None:
            return self.engine_config
        return replace(recorded_engine_config(trace), **dict(self.engine_overrides))

    def describe(self) -> dict:
        d = asdict(self)
        del d["kernel"]   # the compiled kernel replays the reference engine byte for byte
        d["arrivals"] = self.arrivals.describe()
        d["trace"] = trace_reference(self.trace)        # no absolute paths in shared outputs
        d["predictor_options"]["train_trace"] = trace_reference(self.predictor_options.train_trace)
        if self.replicas == 1:    # keep the config.json of single-engine runs as it was
            del d["replicas"]
            if not self.prefill_replicas:   # a P/D fleet's router places its prefills
                del d["router"]
        if self.tile is None:     # keep the config.json of untiled runs as it was
            del d["tile"]
        if self.policy_options:
            d["policy_options"] = dict(self.policy_options)
        else:                     # keep the config.json of runs without policy settings as it was
            del d["policy_options"]
        if not self.prefill_replicas:   # keep the config.json of other runs as it was
            for key in PD_FIELDS:
                del d[key]
        if self.goodput:
            d["goodput"] = dict(self.goodput)
        else:                     # keep the config.json of runs without SLOs as it was
            del d["goodput"]
        if self.preset is None:   # keep the config.json of runs without a preset as it was
            del d["preset"], d["engine_overrides"]
            d["engine_config"] = engine_config_record(self.engine_config)
        else:
            del d["engine_config"]
            d["engine_overrides"] = dict(self.engine_overrides)
        return d


def _int_field(record: dict, key: str) -> int:
    """An integer field of a config.json; a wrong type names the key (not int()'s bare message)."""
    try:
        return int(record[key])
    except (TypeError, ValueError):
        raise ValueError(f"key {key!r} must be an integer, got {record[key]!r}") from None


def config_from_record(record: dict) -> RunConfig:
    """The :class:`RunConfig` a run's ``config.json`` was written from (``simulate --config``): the
    same fields give the same bytes. Refuses a record that is not a run configuration, and a trace
    whose content changed since (its hash is recorded)."""
    if not isinstance(record, dict) or "trace" not in record or "predictor" not in record:
        raise ValueError("not a run's config.json (no trace and predictor)")
    unknown_keys = sorted(set(record) - {f.name for f in fields(RunConfig)} - set(RESOLVED_KEYS))
    if unknown_keys:   # a typo or another version's field would otherwise be dropped unseen
        raise ValueError(f"unknown key(s) {', '.join(map(repr, unknown_keys))} (this version writes "
                         "and reads no such field)")
    for key, kind in (("load", (int, float)), ("requests", int), ("tile", int)):   # null or a number
        value = record.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, kind)):
            raise ValueError(f"key {key!r} must be {'a number' if key == 'load' else 'an integer'} or null, "
                             f"got {value!r}")
    try:
        options = dict(record.get("predictor_options") or {})
        known = {f.name for f in fields(PredictorOptions)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(f"unknown predictor option(s) {', '.join(unknown)}")
        engine = dict(record.get("engine_config") or {})
        config = RunConfig(
            trace=record["trace"], predictor=record["predictor"], policy=record["policy"], engine=record["engine"],
            load=record["load"], arrivals=ArrivalSpec.parse(record["arrivals"]), requests=record.get("requests"),
            seed=_int_field(record, "seed"), tile=record.get("tile"), engine_config=EngineConfig(**engine), predictor_options=PredictorOptions(**options),
            charge_cost=bool(record.get("charge_cost", True)), preset=record.get("preset"),
            engine_overrides=tuple(sorted((record.get("engine_overrides") or {}).items())),
            replicas=int(record.get("replicas", 1)), router=record.get("router", DEFAULT_ROUTER),
            policy_options=tuple(sorted((record.get("policy_options") or {}).items())),
            **{key: record[key] for key in PD_FIELDS if key in record},
            goodput=tuple((k, float(v)) for k, v in parse_goodput(
                [f"{k}:{v}" for k, v in (record.get("goodput") or {}).items()]).items()))
    except KeyError as exc:
        raise ValueError(f"config.json has no {exc.args[0]!r}") from None
    except TypeError as exc:
        raise ValueError(f"config.json: {exc}") from None
    recorded = record.get("trace_hash")
    if recorded is not None:
        now = load_trace(config.trace).content_hash
        if now != recorded:
            raise ValueError(f"trace {config.trace!r} changed since the run (content hash {now[:12]}, "
                             f"recorded {recorded[:12]}): it cannot be rerun exactly")
    return config


def check_fleet(replicas: int, router: str, predictor: str, arrivals: ArrivalSpec) -> None:
    """A fleet's settings, before anything is loaded: replicas in range, a known router, a predictor
    that can serve a router reading predicted work, arrivals a fleet can route."""
    from predictors import PREDICTORS

    check_router(replicas, router, PREDICTORS, predictor)
    if replicas > 1 and arrivals.kind == "closed":
        raise ValueError("--replicas: a closed loop releases requests at completions of one engine; "
                         "a fleet routes open arrivals (poisson, trace, FILE.csv, recorded, steps)")


def engine_config_record(config: EngineConfig) -> dict:
    """An engine config as config.json holds it: without the KV block fields while KV is unbounded,
    so the config.json of runs without ``--kv-blocks`` stays as it was."""
    d = asdict(config)
    if not config.kv_bounded:
        del d["kv_blocks"], d["kv_block_size"]
    del d["prefix_caching"]
    if config.kv_bounded:
        d["prefix_caching"] = config.caches_prefixes
    return d


def resolve_kv_blocks(config: EngineConfig, profile) -> EngineConfig:
    """``--kv-blocks profile``: the blocks the profile's GPU memory holds beside the weights."""
    if config.kv_blocks != KV_BLOCKS_FROM_PROFILE:
        return config
    blocks = kv_blocks_in_memory(profile.hardware, config.kv_block_size)
    if blocks < 1:   # named as typed: the user gave 'profile' and a block size, not 0 blocks
        raise ValueError(f"--kv-blocks profile --block-size {config.kv_block_size}: engine profile "
                         f"{profile.describe().get('name')!r} holds no block of {config.kv_block_size} tokens beside "
                         "its weights; give a smaller --block-size or --kv-blocks N")
    return replace(config, kv_blocks=blocks)


def check_kv_budget(workload: Trace, config: EngineConfig) -> None:
    """A KV budget below some prompt + its first token could only be kept by never admitting it."""
    if config.kv_token_budget is None or not len(workload):
        return
    need = workload.prompt_tokens.astype(np.int64) + 1
    row = int(np.argmax(need))
    if need[row] > config.kv_token_budget:
        raise ValueError(f"kv-budget {config.kv_token_budget} cannot hold request {workload.request_id[row]} of trace "
                         f"{workload.name!r} ({need[row] - 1} prompt tokens + its first token)")


#: What :func:`prepare` writes into a run's config.json beside the :class:`RunConfig` fields.
RESOLVED_KEYS = ("trace_name", "trace_hash", "trace_path", "requests_used", "policy_settings", "engine_settings",
                 "capacity_req_s", "arrival_rate_req_s", "arrivals_hash", "code_hash", "predictor_settings",
                 "predictor_cost", "engine_config_used", "closed_loop_window", "router_settings",
                 "kv_blocks_used", "decode_router_settings")


@dataclass
class Prepared:
    """A run with every input resolved and checked, ready to simulate."""

    config: RunConfig
    workload: Trace
    simulation: Simulation
    capacity_req_s: float | None        # None for arrivals replayed as recorded
    arrival_rate_req_s: float | None
    resolved: dict
    #: runs it on the kernel chosen for it (one engine: chosen at the run; a fleet: when prepared)
    runs: Callable[[], RunResult] = field(repr=False, compare=False)


def prepare(config: RunConfig, progress: Callable[[int, int], None] | None = None,
            record_steps: bool = False, trace: Trace | None = None) -> Prepared:
    """Load, validate and build everything; raises TraceError/ValueError before any output.
    ``trace``: ``config.trace`` already loaded (a sweep ships it to its workers once)."""
    trace = trace if trace is not None else load_trace(config.trace)
    # a workload of whole copies of the trace (and a partial last one) has the trace's mix, so its
    # capacity is the trace's: measured once per trace and settings (cached) at every tile size
    mix = trace if config.tile is not None and config.tile >= len(trace) and config.requests is None else None
    if config.tile is not None:
        trace = tile_trace(trace, config.tile)
    workload = trace if config.requests is None else trace.take(np.arange(min(config.requests, len(trace))))
    if config.requests is not None and config.requests > len(trace):
        raise ValueError(f"--requests {config.requests}: trace {trace.name!r} has only {len(trace)} requests"
                         f"{'' if config.tile else ' (--tile N repeats it to N)'}")
    policy = make_policy(config.policy, config.policy_options, config.goodput)
    predictor = None if config.predictor == NO_PREDICTOR else make_predictor(config.predictor, config.predictor_options)
    if predictor is None and policy.uses_predictions:
        raise ValueError(f"policy {config.policy!r} needs a predictor (--predictor)")
    if predictor is not None and not predictor.sees_true_lengths and is_serving(trace):
        workload = with_source_features(workload)   # a serving trace holds no hidden states of its own
    profile = make_profile(config.engine, trace)
    engine_config = resolve_kv_blocks(config.engine_config_for(trace), profile)
    check_kv_budget(workload, engine_config)
    check_kv_blocks(workload, engine_config)
    if config.replicas > 1:   # a router reading KV blocks or prefix caches needs them modelled
        check_router_cache(config.router, engine_config.kv_bounded, engine_config.caches_prefixes)
    window = None
    if config.arrivals.as_recorded:   # no capacity: nothing is rescaled to a load
        capacity = None
        arrival_s = make_arrivals(config.arrivals, workload, None, config.seed)
        span = float(arrival_s.max() - arrival_s.min()) if len(arrival_s) else 0.0
        rate = (len(arrival_s) - 1) / span if config.arrivals.kind == "recorded" and span > 0 else None
        if config.arrivals.kind == "closed":
            window = config.arrivals.window or recorded_window(trace)
    else:
        capacity = measure_capacity(mix if mix is not None else workload, profile, engine_config,
                                    run=lambda sim: run_simulation(sim, config.kernel, note=fleet_size(config) == 1))
        capacity *= fleet_size(config)   # N identical replicas: N x one engine's (docs/semantics.md "Fleets")
        assert config.load is not None   # RunConfig refuses a rate-driven run without a load
        rate = config.load * capacity
        arrival_s = make_arrivals(config.arrivals, workload, rate, config.seed)
    if config.prefill_replicas:
        return prepared_pd(config, workload, trace, arrival_s, capacity, rate, engine_config, profile, _prepared_fleet)
    if config.replicas > 1:
        return _prepared_fleet(config, workload, trace, arrival_s, capacity, rate, engine_config, profile)
    # binds the predictor (trains or loads it), so a bad training trace fails before any output
    sim = Simulation(workload, arrival_s, policy=policy, predictor=predictor, profile=profile,
                     config=engine_config, seed=config.seed, charge_cost=config.charge_cost,
                     record_steps=record_steps, progress=progress, closed_loop=window,
                     step_clock=config.arrivals.step_clock)
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
    if predictor is not None:
        resolved["predictor_settings"] = predictor.describe()
        cost = sim.predictor_cost
        assert cost is not None   # bound with a predictor
        resolved["predictor_cost"] = describe_cost(cost)
    if engine_config.kv_bounded:
        resolved["kv_blocks_used"] = engine_config.kv_blocks
    if config.preset is not None or window is not None:
        resolved["engine_config_used"] = engine_config_record(engine_config)
        resolved["closed_loop_window"] = window
    return Prepared(config, workload, sim, capacity, rate, resolved, runs=lambda: run_simulation(sim, config.kernel))


def run_simulation(sim: Simulation, kernel: str, note: bool = True) -> RunResult:
    """Run ``sim`` on ``kernel`` (one of :data:`KERNELS`): the compiled kernel where it replays the run
    byte for byte (:func:`simulator.compiled.unsupported`), else the reference engine, never silently
    (:func:`simulator.compiled.note_fallback`; ``note`` False where the caller says it: a fleet's capacity
    run, whose fleet notes the same reason once). The one place that chooses; the engine runs what it is given."""
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r} (known: {', '.join(KERNELS)})")
    if kernel == "compiled":
        reason = unsupported(sim)
        if reason is None:
            return sim.run(CompiledRun)
        if note:
            note_fallback(reason)
    return sim.run()


def _prepared_fleet(config: RunConfig, workload: Trace, trace: Trace, arrival_s: np.ndarray, capacity: float | None,
                    rate: float | None, engine_config: EngineConfig, profile, build=None) -> Prepared:
    """The fleet's :class:`Prepared`: on the compiled kernel where one engine of it is compiled
    (:class:`simulator.compiled_fleet.CompiledFleet`), else the reference engine, never silently.
    ``build``: makes the fleet in place of those (a P/D fleet, :mod:`simulator.pd_config`)."""

    def predictor_factory():
        return None if config.predictor == NO_PREDICTOR else make_predictor(config.predictor, config.predictor_options)

    fleet_class = FleetSimulation if build is None else build
    if config.kernel == "compiled" and build is None:
        reason = fleet_unsupported(engine_config, make_policy(config.policy, config.policy_options, config.goodput),
                                   predictor_factory(), profile)
        if reason is None:
            fleet_class = CompiledFleet
        else:
            note_fallback(f"a fleet: {reason}")
    router = make_router(config.router)
    fleet = fleet_class(workload, arrival_s, replicas=config.replicas, router=router,
                            make_policy=lambda: make_policy(config.policy, config.policy_options, config.goodput), make_predictor=predictor_factory,
                            profile=profile, config=engine_config, seed=config.seed, charge_cost=config.charge_cost,
                            step_clock=config.arrivals.step_clock)
    predictor = fleet.predictors[0] if fleet.predictors else None
    resolved = {
        **config.describe(),
        "trace_name": trace.name,
        "trace_hash": trace.content_hash,
        "trace_path": trace_reference(trace.path) if trace.path else None,
        "requests_used": len(workload),
        "policy_settings": make_policy(config.policy, config.policy_options, config.goodput).describe(),
        "engine_settings": profile.describe(),
        "capacity_req_s": capacity,
        "arrival_rate_req_s": rate,
        "arrivals_hash": hashlib.sha256(np.ascontiguousarray(arrival_s, dtype=np.float64).tobytes()).hexdigest(),
        "code_hash": code_hash(),
        "router_settings": router.describe(),
    }
    if predictor is not None:
        resolved["predictor_settings"] = predictor.describe()
        resolved["predictor_cost"] = describe_cost(predictor.cost(profile.hardware))
    if engine_config.kv_bounded:
        resolved["kv_blocks_used"] = engine_config.kv_blocks
    if config.preset is not None:
        resolved["engine_config_used"] = engine_config_record(engine_config)
    return Prepared(config, workload, fleet, capacity, rate, resolved, runs=fleet.run)  # type: ignore[arg-type]


def execute(prepared: Prepared) -> tuple[dict, RunResult]:
    """Run a prepared simulation and summarise it."""
    result = prepared.runs()
    cfg = prepared.config
    summary = summarize(
        result,
        slos=dict(cfg.goodput),
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
        **({"router": cfg.router} if cfg.replicas > 1 else {}),   # a fleet's (its replicas: fleet_balance)
    )
    return summary, result
