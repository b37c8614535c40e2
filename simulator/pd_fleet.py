"""A prefill/decode (P/D) fleet: P prefill instances and D decode instances on one SimPy clock
(docs/semantics.md "Prefill/decode disaggregation").

A request is placed on a prefill instance at its arrival (``router``, as in a fleet), prefilled
there (chunked as the engine's settings say) and finishes there at the end of its prefill step; its
estimate is made there. Then ``decode_router`` places it on a decode instance, its prompt's KV
crosses the link (:class:`simulator.pd_link.KVLink`) once the decode instance has reserved its blocks,
and it joins that instance's waiting queue when the transfer lands: admitted, it recomputes its last
prompt token (vLLM's decode instance does: a full prompt hit recomputes one token) and emits its
first token at the end of that step (the client's TTFT: vLLM's proxy streams the decode instance's
response), then decodes there. Every instance is the engine of docs/semantics.md with its own request
table, scheduler and policy instance; the fleet only places, transfers and forwards.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import simpy

from routers import serves
from routers.base import Router
from routers.snapshot import FleetBalance, ReplicaAccounting, work_sum
from simulator.engine import RunResult
from simulator.fleet import FleetSimulation, Replica
from simulator.pd_link import KVLink
from simulator.pd_parts import CarriedEstimates, DecodeScheduler, PrefillDriver, ReservedKVBlocks
from simulator.pd_view import decode_view, kv_blocks_of
from simulator.replica_table import AccountedTable
from simulator.stepping import build_parts


class PDFleet(FleetSimulation):
    """P prefill and D decode instances; the prefill side is a :class:`FleetSimulation` of P replicas
    whose requests end at their first token (``length`` 1 in its tables)."""

    driver_cls = PrefillDriver   # a prefill instance learns from its requests' decode instances

    def __init__(self, workload, arrival_s, *, prefill_replicas: int, decode_replicas: int, router: Router,
                 decode_router: Router, link: KVLink, **kwargs):
        if kwargs.get("step_clock"):
            raise ValueError("--prefill-replicas/--decode-replicas: the step clock is not modelled with a KV link")
        if not isinstance(decode_replicas, (int, np.integer)) or decode_replicas < 1:
            raise ValueError(f"--decode-replicas must be >= 1, got {decode_replicas!r}")
        super().__init__(workload, arrival_s, replicas=prefill_replicas, router=router, **kwargs)
        if self.config.prefix_caching:
            raise ValueError("--prefix-caching on: a P/D fleet does not model prefix caching yet (--prefix-caching off)")
        self.config = dataclasses.replace(self.config, prefix_caching=False)   # off by default here, stated
        if self.config.kv_token_budget is not None:
            raise ValueError("--kv-budget is one engine's KV model; a P/D fleet models KV blocks (--kv-blocks)")
        if "decode" not in decode_router.stages:
            raise ValueError(f"--decode-router {decode_router.name} cannot place decodes")
        first = self.predictors[0] if self.predictors else None
        if not serves(decode_router.name, first):
            raise ValueError(f"--decode-router {decode_router.name} reads estimates: --predictor "
                             f"{first.name if first is not None else 'none'} cannot serve it")
        self.decode_replicas, self.decode_router, self.link = int(decode_replicas), decode_router, link
        self.link_s = np.array([link.seconds(int(p), self.profile.hardware) for p in self.prompt])

    # --- building ----------------------------------------------------------------------------------
    def _decoder(self, index: int, env: simpy.Environment) -> Replica:
        n = self.n
        # its counters (routers/snapshot.py) are the decode router's: a request joins them at its
        # placement (decode_placed), its table at its landing
        table = AccountedTable(self.workload, np.full(n, np.inf), self.decode_accounting, index)
        table.fill, table.fill_sq = np.ones(n, dtype=np.int64), np.ones(n, dtype=np.int64)   # the token recomputed
        rows = np.full(n, -1, dtype=np.int64)
        kind = self.predictors[0].output if self.predictors else None
        def report(done: np.ndarray, lengths: np.ndarray) -> None:
            self._report(index, done, lengths)

        driver = CarriedEstimates(table, kind, report)
        parts = build_parts(table, self.make_policy(), None, None, self.profile, self.config, env, charge_cost=False,
                            step_clock=False, driver=driver, scheduler_cls=DecodeScheduler)
        if self.config.kv_bounded:
            parts.scheduler.kv = ReservedKVBlocks(table, self.config.kv_blocks_total, self.config.kv_block_size)
        return Replica(index, parts, rows, driver=driver)

    # --- the run -----------------------------------------------------------------------------------
    def run(self) -> RunResult:
        if self._ran:
            raise RuntimeError("a PDFleet runs once (its predictors' online state is spent); build a new one")
        self._ran = True
        env = self.env = simpy.Environment()
        self._start()   # the prefill side's routing state (the fleet's)
        self.fleet = [self._replica(i, env) for i in range(self.replicas)]
        self._start_decode(env)
        for replica in self.fleet:
            env.process(self._replica_loop(env, replica))
        for decoder in self.decoders:
            env.process(self._decoder_loop(env, decoder))
        env.process(self._router_loop(env))
        started = time.process_time()
        env.run()
        sim_cpu_s = time.process_time() - started
        if self.done != self.n or self.next_row != self.n:
            raise RuntimeError(f"P/D fleet simulation ended with {self.n - self.done} unfinished requests")
        return self._pd_result(sim_cpu_s)

    def _start_decode(self, env: simpy.Environment) -> None:
        """The decode side's state: its instances, accounting, queues and router."""
        kv_total = self.config.kv_blocks_total if self.config.kv_bounded else None
        self.decode_accounting = ReplicaAccounting(self.decode_replicas, kv_total)
        self.decoders = [self._decoder(i, env) for i in range(self.decode_replicas)]
        n = self.n
        self.done = 0
        self.prefill_local = np.full(n, -1, dtype=np.int64)   # local row there
        self.decode_of = np.full(n, -1, dtype=np.int64)       # decode instance
        self.transfer = np.full((n, 3), np.nan)               # decode-placed, transfer start, landing
        self.carried = np.zeros(n, dtype=np.float64)          # the estimate the request carries
        self.queued: list[list[int]] = [[] for _ in self.decoders]    # placed, waiting for blocks (FIFO)
        self.in_flight: list[list[int]] = [[] for _ in self.decoders]  # transferring, in start order
        self.wake: list[simpy.Event | None] = [None] * self.decode_replicas
        self.decode_balance = FleetBalance()   # outstanding true work per decode instance, at placements
        self.decode_router.reset(self.decode_replicas, self.seed)

    def _joined(self, replica: Replica, k: int) -> None:
        """Its prefill instance's part of a request ends at its first token: ``length`` 1 there."""
        self.prefill_local[replica.rows[k]] = k
        replica.parts.table.length[k] = 1
        super()._joined(replica, k)

    def _sync(self, now: float) -> None:
        """At ``now``: land the prefill steps, then the decode steps ending now (instance order); place
        the arrivals up to now on prefill instances; place the requests prefilled now on decode
        instances (row order); start the transfers whose blocks are free; land those arriving now."""
        prefilled: list[int] = []
        for replica in self.fleet:
            batch = replica.land_if_due(now)
            if batch is not None:
                self._kv_changed(replica)
                prefilled += replica.rows[batch.first].tolist()
        for decoder in self.decoders:
            decoder.land_if_due(now)
        while self.next_row < self.n and self.arrival[self.next_row] <= now:
            self._route(self.next_row)
            self.next_row += 1
        for row in sorted(prefilled):
            self._place_decode(row, now)
        for index in range(self.decode_replicas):
            self._start_transfers(index, now)
            self._land(index, now)

    def _place_decode(self, row: int, now: float) -> None:
        p = self.fleet[self.assigned[row]].parts.table
        self.carried[row] = p.predicted[self.prefill_local[row]]
        index = self.decode_router.choose(row, decode_view(self, self.decode_router.reads))
        if not 0 <= index < self.decode_replicas:
            raise RuntimeError(f"decode router {self.decode_router.name!r} chose {index} of {self.decode_replicas}")
        self.decode_of[row] = index
        self.transfer[row, 0] = now
        self.queued[index].append(row)
        self.decode_accounting.route(index, self._carried_work(row))
        self.decode_balance.add(self.decode_accounting)

    def _carried_work(self, row: int):
        """The request's work before its first token on the decode instance (the accounting's)."""
        return work_sum(self.carried[row:row + 1], np.zeros(1, dtype=np.int64), self.length[row:row + 1])

    def _start_transfers(self, index: int, now: float) -> None:
        """The queue's head starts when the decode instance has its prompt's blocks (FIFO), and none
        of its preempted requests waits for blocks (they come first)."""
        kv = self._kv(index)
        queue = self.queued[index]
        while queue and not (kv is not None and kv.requeued):
            row = queue[0]
            if kv is not None and not kv.reserve(int(kv_blocks_of(self.prompt[row], self.config.kv_block_size))):
                return
            queue.pop(0)
            self.transfer[row, 1], self.transfer[row, 2] = now, now + self.link_s[row]
            self.in_flight[index].append(row)
            self.env.process(self._transfer(self.env, now + self.link_s[row]))

    def _kv(self, index: int) -> ReservedKVBlocks | None:
        kv = self.decoders[index].parts.scheduler.kv
        assert kv is None or isinstance(kv, ReservedKVBlocks)
        return kv

    def _transfer(self, env: simpy.Environment, land: float):
        yield env.timeout(land - env.now)
        self._sync(env.now)

    def _land(self, index: int, now: float) -> None:
        """Transfers landing by ``now`` join the decode instance's waiting queue (landing order, then
        start order)."""
        flight = self.in_flight[index]
        landed = sorted((r for r in flight if self.transfer[r, 2] <= now), key=lambda r: self.transfer[r, 2])
        if not landed:
            return
        decoder = self.decoders[index]
        t, kv = decoder.parts.table, self._kv(index)
        for row in landed:
            flight.remove(row)
            k = decoder.routed
            decoder.rows[k] = row
            t.arrival[k] = now
            t.prompt[k], t.prompt_sq[k] = self.prompt[row], self.prompt[row] * self.prompt[row]
            t.length[k] = self.length[row]
            p = self.fleet[self.assigned[row]].parts.table
            placed = self._carried_work(row)
            self.carried[row] = t.predicted[k] = t.route_estimate[k] = p.predicted[self.prefill_local[row]]  # type: ignore[attr-defined]
            if self._carried_work(row) != placed:   # published between its placement and its landing
                self.decode_accounting.change(index, placed, self._carried_work(row))
            t.first_predicted[k], t.ready_s[k] = p.first_predicted[self.prefill_local[row]], p.ready_s[self.prefill_local[row]]
            if kv is not None:
                kv.landed(k, int(kv_blocks_of(self.prompt[row], self.config.kv_block_size)))
            decoder.routed += 1
        wake = self.wake[index]
        if wake is not None and not wake.triggered:
            wake.succeed()

    def _report(self, index: int, done: np.ndarray, lengths: np.ndarray) -> None:
        """A decode instance's completions: counted, and their true lengths sent to the prefill
        instances that estimated them (instance order, then completion order)."""
        self.done += len(done)
        rows = self.decoders[index].rows[done]
        for p in np.unique(self.assigned[rows]):
            mine = self.assigned[rows] == p
            driver = self.fleet[p].driver
            if isinstance(driver, PrefillDriver):
                driver.learn(self.prefill_local[rows[mine]], lengths[mine])

    def _decoder_loop(self, env: simpy.Environment, decoder: Replica):
        table, scheduler, parts = decoder.parts.table, decoder.parts.scheduler, decoder.parts
        while True:
            now = env.now
            self._sync(now)
            arrived = table.arrived_by(now)
            if scheduler.idle(arrived):
                if self.done >= self.n:
                    return
                self.wake[decoder.index] = env.event()
                yield self.wake[decoder.index]
                continue
            batch, duration = parts.begin(now, arrived, decoder.step)
            decoder.pending = (batch, decoder.step, now, duration, now + duration)
            yield env.timeout(duration)

    def _pd_result(self, sim_cpu_s: float) -> RunResult:
        from simulator.pd_result import pd_result
        return pd_result(self, sim_cpu_s)

