"""A prefill/decode fleet on the compiled kernel (docs/semantics.md "Prefill/decode disaggregation").

:class:`CompiledPDFleet` replays :class:`simulator.pd_fleet.PDFleet` byte for byte where its estimates
are fixed per row at bind time (no predictor, the oracles) and KV is unbounded. Then nothing flows back
from the decode side to the prefill side (no predictor learns from a completion, no transfer waits for
blocks), so the run is two walks, each the compiled fleet's (:mod:`simulator.compiled_fleet`):

- the prefill instances: the compiled fleet's walk over the arrival instants, every request ending at
  its first token (``length`` 1 there); each one's prefill end is then known;
- the decode instances: a walk over the decode placements (the prefill ends, rows in row order at an
  instant) and the transfers' landings; before each, the decode instances' kernels run up to it
  (``STATE.until``: every step ending by then lands, none starts at or after it), then the requests
  are placed (the decode router reads the accounting recounted from the kernels), their transfers
  start, and those landing then join their decode instance's table, as :meth:`PDFleet._sync` orders them.

A transfer lands at its own timeout, transfer start + (landing - start) as SimPy computes it; an idle
decode instance resumes exactly then (the reference's wake event), not at the kernel's idle arithmetic.
"""

from __future__ import annotations

import heapq
import time

import numpy as np
import simpy

from predictors.base import Known
from routers.snapshot import WorkSum, work_sum
from simulator.compiled import CompiledRun
from simulator.compiled_fleet import CompiledFleet, _engine, fleet_unsupported, run_until
from simulator.engine import RunResult
from simulator.fleet import Replica
from simulator.kernel_layout import UNTIL
from simulator.pd_fleet import PDFleet
from simulator.replica_table import replica_work


def pd_unsupported(config, policy, predictor, profile) -> str | None:
    """Why the compiled kernel cannot replay a P/D fleet of these engines (None: it can)."""
    if config.kv_bounded:   # before the fleet's reasons: a P/D fleet turns prefix caching off itself
        return "--kv-blocks at its decode instances is not compiled yet"
    if predictor is not None and (not predictor.static_estimates or predictor.learns_online):
        return f"predictor {predictor.name!r} estimates in Python (compiled there: none, the oracles)"
    reason = fleet_unsupported(config, policy, predictor, profile)
    if reason is not None or predictor is None:
        return reason
    return fleet_unsupported(config, policy, CarriedEstimate(predictor.output, None), profile)


class CarriedEstimate:
    """What a decode instance's kernel reads as its predictor: estimates fixed per row (the kernel's
    static mode) that are the decode table's own ``predicted``, written as each request lands with the
    estimate it carries (:meth:`PDFleet._land`). No predictor runs there."""

    name = "carried"
    compiled = True
    why_not: dict = {}
    static_estimates = True
    stage = "prefill"   # not "arrival": the decode instance does not order admission by estimate
    learns_online = False
    feedback_batch = 0
    refresh_every = None
    observes_prefill = False

    def __init__(self, output: str, table):
        self.output, self.table = output, table

    def predict(self, rows: np.ndarray, known: Known) -> np.ndarray:
        """The table's own array (CompiledRun keeps a contiguous float64 array as it is)."""
        return self.table.predicted


class CompiledPDFleet(PDFleet, CompiledFleet):
    """:class:`PDFleet` with every instance's engine steps in the compiled kernel."""

    def run(self) -> RunResult:
        if self._ran:
            raise RuntimeError("a PDFleet runs once (its predictors' online state is spent); build a new one")
        self._ran = True
        env = self.env = simpy.Environment()   # the drivers are built on it; nothing runs on it
        self._start_compiled(env)   # the prefill instances (CompiledFleet's)
        self._start_decode(env)
        started = time.process_time()
        self._walk()   # the prefill instances (CompiledFleet's walk over the arrivals)
        for replica, run in zip(self.fleet, self.runs):
            run.finish()
            self._settle(replica, run)
            if run.predicted is not replica.parts.table.predicted:   # static: what PDFleet._land reads
                replica.parts.table.predicted[:replica.routed] = run.predicted[:replica.routed]
        self._decode_walk()
        for decoder, run in zip(self.decoders, self.decode_runs):
            run.finish()
            self._settle(decoder, run)
        sim_cpu_s = time.process_time() - started
        self.done = sum(run.finished for run in self.decode_runs)
        if self.done != self.n or self.next_row != self.n:
            raise RuntimeError(f"P/D fleet simulation ended with {self.n - self.done} unfinished requests")
        return self._pd_result(sim_cpu_s)

    def _start_decode(self, env: simpy.Environment) -> None:
        """:meth:`PDFleet._start_decode`, and a kernel per decode instance."""
        super()._start_decode(env)
        self.decode_runs = [self._decode_run(decoder) for decoder in self.decoders]

    def _decode_run(self, decoder: Replica) -> CompiledRun:
        table = decoder.parts.table
        carried = CarriedEstimate(self.predictors[0].output, table) if self.predictors else None
        engine = _engine(self.config, decoder.parts.scheduler.policy, carried, self.profile, False)
        return CompiledRun(engine, table, decoder.driver, fast_paths=False)

    # --- the decode side's walk ------------------------------------------------------------------
    def _decode_walk(self) -> None:
        """Placements at the prefill ends (row order within an instant) and landings, in time order."""
        ends = np.full(self.n, np.nan)
        for replica in self.fleet:
            k = replica.routed
            ends[replica.rows[:k]] = replica.parts.table.first_token_s[:k]
        order = np.lexsort((np.arange(self.n), ends))   # by prefill end, then row
        landings: list[tuple[float, int]] = []          # (landing instant, decode instance), a heap
        i = 0
        while i < self.n or landings:
            place_at = float(ends[order[i]]) if i < self.n else np.inf
            now = min(place_at, landings[0][0]) if landings else place_at
            landing = set()
            while landings and landings[0][0] == now:
                landing.add(heapq.heappop(landings)[1])
            if now == place_at:
                for index, run in enumerate(self.decode_runs):
                    self._decode_until(index, run, now)
                self._recount_decoders()
                while i < self.n and ends[order[i]] == now:
                    self._place_decode(int(order[i]), now)
                    i += 1
                for index in range(self.decode_replicas):
                    for start in self._start_all(index, now):
                        heapq.heappush(landings, (start, index))
            else:
                for index in sorted(landing):
                    self._decode_until(index, self.decode_runs[index], now)
            for index in range(self.decode_replicas):
                self._land_compiled(index, now)
        for index, run in enumerate(self.decode_runs):
            self._decode_until(index, run, np.inf)

    def _decode_until(self, index: int, run: CompiledRun, until: float) -> None:
        run_until(run, until)
        self.decoders[index].parts.table.finished = run.finished

    def _start_all(self, index: int, now: float) -> list[float]:
        """Unbounded KV: every queued transfer starts at its placement; returns their landing instants
        (SimPy's timeouts: start + (landing - start))."""
        started = []
        for row in self.queued[index]:
            land = now + self.link_s[row]
            self.transfer[row, 1], self.transfer[row, 2] = now, land
            self.in_flight[index].append(row)
            started.append(now + (land - now))
        self.queued[index].clear()
        return started

    def _land_compiled(self, index: int, now: float) -> None:
        """:meth:`PDFleet._land`; an idle decode instance resumes at the landing instant itself."""
        decoder, run = self.decoders[index], self.decode_runs[index]
        before = decoder.routed
        self._land(index, now)
        st = run.st
        if decoder.routed > before and not st.held and st.n_res == 0 and st.partial < 0 and st.n_requeued == 0 \
                and st.n_admitted >= before and st.status == UNTIL:
            st.now = now

    def _recount_decoders(self) -> None:
        """The decode accounting from the kernels (as :meth:`CompiledFleet._recount`) and the requests
        placed and not landed (0 tokens generated there, their carried estimate)."""
        predicted = self.decode_router.reads == "predicted_work"
        for index, (decoder, run) in enumerate(zip(self.decoders, self.decode_runs)):
            st = run.st
            running = int(st.held) - 1 - int(run.last.n_preempted) if st.held else int(st.n_res)
            table = decoder.parts.table
            work = replica_work(table, decoder.unfinished(), run.predicted, table.route_estimate,  # type: ignore[attr-defined]
                                predicted, True)
            pending = np.asarray(self.queued[index] + self.in_flight[index], dtype=np.int64)
            extra = work_sum(self.carried[pending], np.zeros(len(pending), dtype=np.int64), self.length[pending]) \
                if predicted else WorkSum(true=int(np.maximum(self.length[pending], 1).sum()))
            total = WorkSum(work.whole + extra.whole, work.units + extra.units, work.true + extra.true)
            self.decode_accounting.set_replica(index, len(pending) + decoder.routed - run.finished, running, total)
