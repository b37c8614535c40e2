"""A fleet: N whole engines (replicas) behind a router, under one SimPy clock.

Each replica is the single engine's parts (:class:`simulator.stepping.EngineParts`: its own request
table, scheduler, policy instance and prediction driver with its own predictor state) stepping in
its own SimPy process; the fleet only routes. A request is routed once, at its arrival, after every
step that ends at that instant has landed (docs/semantics.md "Fleets"). A replica's table is sized
for the whole workload and filled as requests are routed to it: its local rows are its requests in
arrival order, so its scheduler sees exactly what a single engine of those requests would.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import simpy

from core.attributes import of_trace
from core.trace import Trace
from policies.base import Policy
from predictors.base import Known, Predictor
from routers import check_fleet_pair, check_replicas
from routers.base import Router
from routers.snapshot import FleetBalance, ReplicaAccounting
from simulator.config import EngineConfig
from simulator.engine import RunResult, check_step_clock, checked_arrivals
from simulator.fleet_cache import CacheView
from simulator.fleet_result import fleet_result
from simulator.fleet_rows import ReplicaRows
from simulator.prediction import NoPrediction, PredictionDriver
from simulator.prefix_cache import PrefixKVBlocks, cached_tokens_of
from simulator.profiles.base import EngineProfile
from simulator.replica_table import AccountedTable, replica_work
from simulator.requests import RequestTable
from simulator.scheduler import Batch
from simulator.stepping import EngineParts, build_parts


@dataclass
class Replica:
    """One engine of the fleet and the fleet's bookkeeping of it."""

    index: int
    parts: EngineParts
    rows: np.ndarray                       # global row of each local row (filled as requests are routed)
    routed: int = 0                        # local rows [0, routed) are routed here
    lo: int = 0                            # local rows below it are all finished
    step: int = 0
    pending: tuple[Batch, int, float, float, float] | None = None   # (batch, step, start, duration, end)
    driver: NoPrediction = field(default_factory=NoPrediction)
    estimates: np.ndarray | None = None    # the estimates the engine schedules on (None: its table's)

    def land_if_due(self, now: float) -> Batch | None:
        """Land this replica's step if it ends at ``now``: its batch, or None when none ends then."""
        if self.pending is None or self.pending[4] != now:
            return None
        batch, step, start, duration, end = self.pending
        self.pending = None
        self.parts.end(batch, step, start, duration, end)
        self.step += 1
        return batch

    def unfinished(self) -> np.ndarray:
        """Local rows routed here and not finished (waiting, prefilling or decoding)."""
        t = self.parts.table
        while self.lo < self.routed and not np.isnan(t.finish_s[self.lo]):
            self.lo += 1
        rows = np.arange(self.lo, self.routed)
        return rows[np.isnan(t.finish_s[rows])]


class FleetSimulation:
    """One fleet run: a workload with arrival times, N replicas of one engine, one router.

    ``make_policy`` / ``make_predictor`` build one instance per replica (each replica keeps its own
    policy and predictor state); ``make_predictor`` returns None for runs without a predictor.
    Same inputs and seed -> identical output."""

    #: the prediction driver of each replica (a prefill instance's learns only from its decode instance)
    driver_cls: type[PredictionDriver] = PredictionDriver

    def __init__(self, workload: Trace, arrival_s: np.ndarray, *, replicas: int, router: Router,
                 make_policy: Callable[[], Policy], make_predictor: Callable[[], Predictor | None],
                 profile: EngineProfile, config: EngineConfig, seed: int = 0, charge_cost: bool = True,
                 step_clock: bool = False):
        arrival_s = checked_arrivals(workload, arrival_s)
        check_replicas(replicas)   # before one predictor per replica is bound
        if step_clock:
            check_step_clock(arrival_s, profile, charge_cost)
        order = np.argsort(arrival_s, kind="stable")   # ties keep row (submission) order
        self.workload = workload.take(order) if not np.array_equal(order, np.arange(len(order))) else workload
        self.arrival = arrival_s[order]
        self.n, self.replicas, self.router = len(self.workload), replicas, router
        self.profile, self.config, self.seed = profile, config, seed
        self.charge_cost, self.step_clock = charge_cost, step_clock
        self.make_policy = make_policy
        self.prompt = self.workload.prompt_tokens.astype(np.int64)
        self.length = self.workload.output_tokens.astype(np.int64)
        self.attributes = of_trace(self.workload)   # per row; each replica's table gets its rows' at routing
        self.predictors = self._bind_predictors(make_predictor)
        first = self.predictors[0] if self.predictors else None
        name = first.name if first is not None else "none"
        check_fleet_pair(replicas, router, {name: first} if first is not None else {}, name)
        self._ran = False

    def _bind_predictors(self, make_predictor: Callable[[], Predictor | None]) -> list[Predictor]:
        """One bound predictor per replica, or one shared by all when its estimates are fixed once
        bound (no state to keep apart); empty without a predictor."""
        first = make_predictor()
        if first is None:
            return []
        rng_seed = self.seed
        bound = [first]
        if not first.static_estimates:
            bound += [p for p in (make_predictor() for _ in range(self.replicas - 1)) if p is not None]
        hidden = self.workload.without_lengths()   # one view for every replica: its hidden states read once
        shown = self.workload if first.sees_true_lengths else hidden
        first.bind(shown, np.random.default_rng(rng_seed))
        for predictor in bound[1:]:   # what the first holds read-only per row, held once
            predictor.bind_beside(first, shown, np.random.default_rng(rng_seed))
        return bound * self.replicas if len(bound) == 1 else bound

    def _table(self, index: int) -> RequestTable:
        """A replica's request table, reporting to the fleet's accounting as its engine runs."""
        return AccountedTable(self.workload, np.full(self.n, np.inf), self.accounting, index,
                              predicted=self.router.reads == "predicted_work")

    def _replica(self, index: int, env: simpy.Environment) -> Replica:
        """One replica: an engine's parts (:func:`simulator.stepping.build_parts`, as the single
        engine's) over its own table, its predictor seen through its local rows."""
        rows = np.full(self.n, -1, dtype=np.int64)
        table = self._table(index)
        table.source_rows = rows   # prefix identity (simulator.prefix_cache.BlockKeys) by workload row
        bound = self.predictors[index] if self.predictors else None
        predictor = ReplicaRows(bound, rows) if bound is not None else None
        cost = bound.cost(self.profile.hardware) if bound is not None else None
        parts = build_parts(table, self.make_policy(), predictor, cost, self.profile, self.config, env,
                            charge_cost=self.charge_cost, step_clock=self.step_clock, driver_cls=self.driver_cls)
        return Replica(index, parts, rows, driver=parts.driver)

    def run(self) -> RunResult:
        if self._ran:
            raise RuntimeError("a FleetSimulation runs once (its predictors' online state is spent); build a new one")
        self._ran = True
        env = simpy.Environment()
        self.env = env
        self._start()
        self.fleet = [self._replica(i, env) for i in range(self.replicas)]
        for replica in self.fleet:
            env.process(self._replica_loop(env, replica))
        if self.replicas > 1:   # with one replica the choice cannot depend on the instant it is made
            env.process(self._router_loop(env))
        started = time.process_time()
        env.run()
        sim_cpu_s = time.process_time() - started
        done = sum(r.parts.table.finished for r in self.fleet)
        if done != self.n or self.next_row != self.n:
            raise RuntimeError(f"fleet simulation ended with {self.n - done} unfinished requests")
        return self._result(sim_cpu_s)

    def _start(self) -> None:
        """The run's routing state: the accounting the router reads, the assignment, the balance."""
        kv_total = self.config.kv_blocks_total if self.config.kv_bounded else None
        self.accounting = ReplicaAccounting(self.replicas, kv_total)
        self.next_row = 0
        self.assigned = np.full(self.n, -1, dtype=np.int64)
        self.route_estimate = np.zeros(self.n, dtype=np.float64)   # per row: the routing estimate (least-work)
        self.balance = FleetBalance()
        self.router.reset(self.replicas, self.seed)

    # --- the clock -------------------------------------------------------------------------------
    def _sync(self, now: float) -> None:
        """Land every step ending at ``now`` (replica order), then route every arrival up to ``now``."""
        for replica in self.fleet:
            if replica.land_if_due(now) is not None:
                self._kv_changed(replica)
        while self.next_row < self.n and self.arrival[self.next_row] <= now:
            self._route(self.next_row)
            self.next_row += 1

    def _replica_loop(self, env: simpy.Environment, replica: Replica):
        table, scheduler, parts = replica.parts.table, replica.parts.scheduler, replica.parts
        while True:
            now = env.now
            self._sync(now)
            arrived = table.arrived_by(now)
            if scheduler.idle(arrived):
                if self.next_row >= self.n:
                    return   # idle with nothing left to route: this replica is done
                yield env.timeout(self.arrival[self.next_row] - now)   # wake at the fleet's next arrival
                continue
            batch, duration = parts.begin(now, arrived, replica.step)
            self._kv_changed(replica)
            replica.pending = (batch, replica.step, now, duration, now + duration)
            yield env.timeout(duration)

    def _router_loop(self, env: simpy.Environment):
        """Wakes at every arrival, so that a request is routed at its own instant even when every
        replica is in the middle of a step."""
        while self.next_row < self.n:
            wait = self.arrival[self.next_row] - env.now
            if wait > 0:
                yield env.timeout(wait)
            self._sync(env.now)

    # --- routing ---------------------------------------------------------------------------------
    def _kv_changed(self, replica: Replica) -> None:
        kv = replica.parts.scheduler.kv
        if kv is not None:
            self.accounting.set_kv(replica.index, kv.used)

    def _route(self, row: int) -> None:
        """Route ``row``: the router reads the accounting (only what it declares), the request
        joins its replica's table, attributes included, and the accounting."""
        reads = self.router.reads
        estimate = self._routing_estimate(row) if reads == "predicted_work" else 0.0
        index = self.router.choose(row, self._cache_view(row, reads) if reads in ("prefix", "cache") else self._view(reads))
        if not 0 <= index < self.replicas:
            raise RuntimeError(f"router {self.router.name!r} chose replica {index} of {self.replicas}")
        replica = self.fleet[index]
        table, k = replica.parts.table, replica.routed
        replica.rows[k] = row
        table.arrival[k] = self.arrival[row]
        table.prompt[k] = self.prompt[row]
        table.prompt_sq[k] = self.prompt[row] * self.prompt[row]
        if table.fill is not table.prompt:   # KV blocks: a preemption gave the table its own prefill sizes
            table.fill[k], table.fill_sq[k] = table.prompt[k], table.prompt_sq[k]
        table.length[k] = self.length[row]
        for i in range(len(self.attributes)):   # the request's attributes travel with it
            table.attributes[i][k] = self.attributes[i][row]
        table.route_estimate[k] = self.route_estimate[row] = estimate   # type: ignore[attr-defined]
        replica.routed += 1
        self.assigned[row] = index
        self._joined(replica, k)
        self.balance.add(self.accounting)

    def _cache_view(self, row: int, reads: str):
        """A cache-aware router's view (simulator/fleet_cache.py), made once per run."""
        if getattr(self, "cache_view", None) is None:
            self.cache_view = CacheView(self)
        return self.cache_view.view(row, reads)

    def hit_blocks(self, replica: Replica, keys: list[int]) -> int:
        """How many of ``keys`` (a prompt's first blocks) the replica's prefix cache holds, from the first."""
        kv = replica.parts.scheduler.kv
        return kv.hit_blocks(keys) if isinstance(kv, PrefixKVBlocks) else 0

    def _view(self, reads: str):
        """What the router reads: the accounting's fields it declares."""
        return self.accounting.view(reads)

    def _joined(self, replica: Replica, k: int) -> None:
        """Local row ``k`` of ``replica`` was routed: the accounting takes it in."""
        replica.parts.table.routed(k)   # type: ignore[attr-defined]

    def _routing_estimate(self, row: int) -> float:
        """The prompt-only estimate the router reads until the replica's own estimate exists."""
        predictor = self.predictors[0]
        if predictor.router_estimate() == "prompt":
            finished = self.n_finished()
            return float(predictor.predict(np.array([row]), Known(arrived=row + 1, finished=finished))[0])
        return float(predictor.prior_length)

    def n_finished(self) -> int:
        """Requests finished in the whole fleet so far."""
        return sum(r.parts.table.finished for r in self.fleet)

    def replica_work(self, replica: Replica, predicted: bool = True, true: bool = True):
        """One replica's work recounted from its table (what the accounting holds for it)."""
        table = replica.parts.table
        estimates = table.predicted if replica.estimates is None else replica.estimates
        return replica_work(table, replica.unfinished(), estimates, table.route_estimate,  # type: ignore[attr-defined]
                            predicted, true)

    # --- the result ------------------------------------------------------------------------------
    def _result(self, sim_cpu_s: float) -> RunResult:
        cached = cached_tokens_of(self.fleet, self.n) if self.config.caches_prefixes else None
        return fleet_result(self, self.fleet, self.fleet, sim_cpu_s, replica=self.assigned.copy(),
                            replicas=self.replicas, cached_tokens=cached,
                            balance_max_over_mean=self.balance.max_over_mean)
