"""A fleet on the compiled kernel: routing in Python, each replica's steps in the kernel.

:class:`CompiledFleet` replays :class:`simulator.fleet.FleetSimulation` byte for byte. The routers
are Python objects and route once per arrival (docs/semantics.md "Fleets"), so the fleet walks its
distinct arrival instants in order; before each, every replica's kernel runs up to it
(``STATE.until``): every step that ends by then lands (at that instant too: those land before the
arrival is routed), no step starts at or after it, and a step that runs past it is composed and held,
landed on the replica's next call, after the routing. A held replica's predictor events that fire
before the instant fire first, against the system before the landing (the router reads them). Each
replica is a :class:`simulator.compiled.CompiledRun` over the replica's own request table, filled as
requests are routed to it, without the predictors' compiled stops (they index the workload's rows).
"""

from __future__ import annotations

import dataclasses
import time
from types import SimpleNamespace

import numpy as np
import simpy

from core.prefix_hashes import native_chains
from predictors.base import Known
from simulator.compiled import CHUNK_STEPS, CompiledRun, unsupported
from simulator.compiled_stall import python_stop
from simulator.engine import RunResult
from simulator.fleet import FleetSimulation, Replica
from simulator.fleet_loop import loop_unsupported, prepare_loop, run_loop
from simulator.fleet_rows import ReplicaRows
from simulator.kernel_layout import DONE_OR_CHUNK, PRED_STATIC, UNTIL
from simulator.kernel_prefix import add_row_keys, hit_blocks
from simulator.replica_growth import first_capacity, grow_replica, next_capacity
from simulator.replica_table import AccountedTable
from simulator.requests import RequestTable


class CompiledRows(ReplicaRows):
    """A replica's view of its predictor that also answers what :class:`CompiledRun` asks of one
    (its declarations: stage, static_estimates, learns_online...), read from the predictor itself."""

    def __getattr__(self, name: str):
        return getattr(self.predictor, name)


def fleet_unsupported(config, policy, predictor, profile) -> str | None:
    """Why the compiled kernel cannot replay a fleet of these engines (None: it can): what one lacks."""
    return unsupported(_engine(config, policy, predictor, profile, False))


def _engine(config, policy, predictor, profile, step_clock: bool) -> SimpleNamespace:
    """What :class:`CompiledRun` and :func:`simulator.compiled.unsupported` read of a simulation."""
    return SimpleNamespace(config=config, policy=policy, predictor=predictor, profile=profile,
                           step_clock=step_clock, record_steps=False)


class CompiledFleet(FleetSimulation):
    """:class:`FleetSimulation` with each replica's engine steps in the compiled kernel."""

    def run(self) -> RunResult:
        if self._ran:
            raise RuntimeError("a FleetSimulation runs once (its predictors' online state is spent); build a new one")
        self._ran = True
        self._start_compiled(simpy.Environment())   # the replicas' drivers are built on it; nothing runs on it
        self.loop_fallback = loop_unsupported(self)   # None: the whole walk in compiled code (simulator/fleet_loop.py)
        compiled = prepare_loop(self) if self.loop_fallback is None else None   # compiled before the clock
        started = time.process_time()
        if compiled is not None:
            run_loop(self, *compiled)
        else:
            self._walk()
        for replica, run in zip(self.fleet, self.runs):
            run.finish()
            self._settle(replica, run)
        sim_cpu_s = time.process_time() - started
        done = sum(r.parts.table.finished for r in self.fleet)
        if done != self.n:
            raise RuntimeError(f"fleet simulation ended with {self.n - done} unfinished requests")
        return self._result(sim_cpu_s)

    def _start_compiled(self, env: simpy.Environment) -> None:
        """The routing state, the replicas and a kernel per replica."""
        self._start()
        self.capacity = self._first_capacity()
        self.chains: tuple | None = None   # the workload's prefix chains, read once for every table
        self.fleet = [self._replica(i, env) for i in range(self.replicas)]
        self.room = 0   # at most the fewest free rows of any replica's table (recounted when short)
        self.runs = [self._compiled(replica) for replica in self.fleet]
        static = self.runs[0].mode == PRED_STATIC
        self.fixed = (self.predictors[0].predict(np.arange(self.n), Known(arrived=0, finished=0)).astype(np.float64)
                      if static else None)
        self.recount = (self.router.reads == "predicted_work", True)   # (predicted, true): the balance reads true

    def _walk(self) -> None:
        """The fleet's arrival instants walked in Python, each replica's kernel called per instant."""
        while True:
            until = float(self.arrival[self.next_row]) if self.next_row < self.n else np.inf
            landed = [run_until(run, until) for run in self.runs]
            if self.next_row >= self.n:
                break
            for replica, run, moved in zip(self.fleet, self.runs, landed):
                if moved or self.config.kv_bounded:   # KV blocks: a held step's admissions and preemptions too
                    self._recount(replica, run)
            self.make_room(int(np.searchsorted(self.arrival, until, side="right")) - self.next_row)
            while self.next_row < self.n and self.arrival[self.next_row] <= until:
                self._route(self.next_row)
                self.room -= 1
                self.next_row += 1

    def _first_capacity(self) -> int:
        """Rows of each replica's first table (simulator/replica_growth.py): the whole workload
        when per-row state is sized once elsewhere (LTR's promotion counters, KV blocks)."""
        form = self.make_policy().compiled_form()
        promotes = form is not None and form.promote_after_idle is not None
        return self.n if promotes or self.config.kv_bounded else first_capacity(self.n, self.replicas)

    def _table(self, index: int, rows: int | None = None) -> RequestTable:
        """The kernel writes the table in place: only routings reach the accounting as they happen.
        ``rows`` rows (the fleet's first capacity), their arrivals +inf until routed."""
        rows = self.capacity if rows is None else rows
        head = self.workload if rows == self.n else dataclasses.replace(   # a zero-copy slice: no feature rows
            self.workload, table=self.workload.table.slice(0, rows), _feature_cache={})
        table = AccountedTable(head, np.full(rows, np.inf), self.accounting, index, events=False)
        if rows != self.n:   # prefix identity by workload row (table.source_rows), as a whole-workload table's
            if self.chains is None:
                self.chains = (native_chains(self.workload),)
            table.prefix_chains = self.chains[0]
        return table

    def _replica(self, index: int, env: simpy.Environment) -> Replica:
        replica = super()._replica(index, env)
        if len(replica.rows) != replica.parts.table.n:   # the global rows, one per row of its table
            rows = replica.rows[:replica.parts.table.n].copy()
            predictor = getattr(replica.parts.driver, "predictor", None)
            if predictor is not None:
                predictor.rows = rows
            replica.rows = replica.parts.table.source_rows = rows
        return replica

    def make_room(self, arriving: int) -> list[int]:
        """Grow every replica's table that has no room for ``arriving`` more rows (the rows of the
        next arrival instant): the replicas grown."""
        if self.room >= arriving:
            return []
        grown = []
        for replica, run in zip(self.fleet, self.runs):
            table = replica.parts.table
            if table.n - replica.routed < arriving:
                size = next_capacity(table.n, replica.routed + arriving, self.n)
                grow_replica(replica, run, self._table(replica.index, size - table.n))
                grown.append(replica.index)
        self.room = min(r.parts.table.n - r.routed for r in self.fleet)
        return grown

    def _recount(self, replica: Replica, run: CompiledRun) -> None:
        """The replica's counters from what its kernel landed since the last routing."""
        replica.parts.table.finished = run.finished
        st = run.st
        # a held step's residents: before it, less those it preempted (they left at its start)
        running = int(st.held) - 1 - int(run.last.n_preempted) if st.held else int(st.n_res)
        predicted, true = self.recount
        work = self.replica_work(replica, predicted, true) if predicted or true else None
        self.accounting.set_replica(replica.index, replica.routed - run.finished, running, work)
        if self.config.kv_bounded:   # the blocks held now (FleetSimulation._kv_changed)
            self.accounting.set_kv(replica.index, int(st.kv_blocks_used))

    def _compiled(self, replica: Replica) -> CompiledRun:
        predictor = CompiledRows(self.predictors[replica.index], replica.rows) if self.predictors else None
        engine = _engine(self.config, replica.parts.scheduler.policy, predictor, self.profile, self.step_clock)
        run = CompiledRun(engine, replica.parts.table, replica.driver, fast_paths=False)
        replica.estimates = run.predicted
        return run

    def _route(self, row: int) -> None:
        super()._route(row)
        if self.config.caches_prefixes:   # the routed row's block keys, for its replica's kernel
            replica = self.fleet[self.assigned[row]]
            add_row_keys(self.runs[replica.index], replica.routed - 1, row)
        if self.fixed is not None:   # estimates fixed per row at bind time: the kernel reads them from its own array
            replica = self.fleet[self.assigned[row]]
            self.runs[replica.index].predicted[replica.routed - 1] = self.fixed[row]

    def hit_blocks(self, replica: Replica, keys: list[int]) -> int:
        """FleetSimulation.hit_blocks read from the replica's compiled pool."""
        return hit_blocks(self.runs[replica.index].work, np.asarray(keys, dtype=np.int64))

    @staticmethod
    def _settle(replica: Replica, run: CompiledRun) -> None:
        """The replica's counters, as the reference fleet reads them, from its kernel's."""
        if run.cached_tokens is not None:
            replica.parts.scheduler.kv.cached_tokens = run.cached_tokens   # type: ignore[union-attr]
        replica.parts.table.finished = run.finished
        replica.step = run.steps
        replica.parts.scheduler.contended = run.contended
        if run.track_error:
            replica.driver.in_use_decodes = int(run.st.decodes)          # type: ignore[attr-defined]
            replica.driver.in_use_abs_error = float(run.st.abs_error)    # type: ignore[attr-defined]


def run_until(run: CompiledRun, until: float) -> bool:
    """Run one replica's kernel up to the fleet's next arrival ``until`` (inf: to its last step),
    doing Python's part of its steps on the way (scores, estimates, feedback, events); returns
    whether anything a router reads may have moved (a step landed, estimates published)."""
    st = run.st
    st.until = until
    moved = False
    while True:
        moved = run.advance(CHUNK_STEPS) > 0 or moved
        status = st.status
        if status == DONE_OR_CHUNK:
            if run.finished == run.table.n:
                return moved
            continue
        moved = python_stop(run, until) or moved
        if status == UNTIL:
            return moved
