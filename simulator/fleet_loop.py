"""The compiled fleet loop: every replica's kernel and the routing in one numba function.

:class:`simulator.compiled_fleet.CompiledFleet` walks the fleet's arrival instants in Python and
calls each replica's kernel once per instant (about 20 us a call). When the run needs no Python
between steps and its router declares a compiled rule (``Router.compiled_rule``, routers/rules.py),
:func:`run_loop` does the same walk inside compiled code instead: before each arrival instant every
replica's kernel runs up to it (``STATE.until``, as :func:`simulator.compiled_fleet.run_until`), the
replicas whose steps landed recount their counters (:meth:`CompiledFleet._recount`), and each
arrival at that instant is routed by the rule, joins its replica's table (attributes included) and
the accounting, and the balance is sampled (routers/snapshot.py), in the reference fleet's order.

It runs when (:func:`loop_unsupported`): the router has a compiled rule and each replica's estimates
are compiled functions of precomputed per-row data (:func:`step_mode`): no predictor, estimates fixed
at routing (``static_estimates``: oracle, noisy-oracle), prefill estimates fixed per row (frozen
leap, egtp) or made by an online rule over the replica's live weights (leap-rls), published after
the prefilling step as the single engine's (simulator/kernel_estimates.py, kernel_online.py),
indexed by the workload's row through the replica's rows. A replica's stop that only Python does
(feedback and the RLS update, a worker's publish, an estimate ready after its step, a held step's
events before the instant) ends the call with LOOP_NEEDS_PYTHON; Python does it
(:func:`simulator.compiled_stall.python_stop`) and the loop goes on from the same instant. Still on
the Python walk: arrival-stage scorers (ssjf, tie, trail, ltr: scored at each arrival from what the
queue holds), decode-time refresh (leap with refresh: re-estimates from recorded decode states).
"""

from __future__ import annotations

import functools
import hashlib
import os
import types
from pathlib import Path

import numpy as np

from predictors.leap import online_rule
from routers import rules
from routers.snapshot import WorkSum
from simulator import kernel_estimates, kernel_online
from simulator.kernel_layout import AFTER_STEP, DONE_OR_CHUNK, STALLED, UNTIL

#: the loop's exit (``info[1]``): done; a replica stalled; a replica needs Python; the router's draws ran
#: out; a replica's table has no room for the next instant's rows (Python grows it, the loop goes on)
LOOP_DONE, LOOP_STALLED, LOOP_NEEDS_PYTHON, LOOP_NO_DRAWS, LOOP_GROW = 0, 1, 2, 3, 4
#: how a replica's prefill estimates are made in the loop (:func:`_published`): none to make (no
#: predictor, or fixed in its own array at routing); fixed per row; the online rule
STEP_PLAIN, STEP_FIXED, STEP_ONLINE = 0, 1, 2
CHUNK = 1 << 16
_UNIT = 1 << 52   # fractions of predicted work, in units of 2**-52 (routers/snapshot.py FRACTION_BITS)


def _kernel(max_steps, t, w, s, state, batch):
    """The replicas' step kernel (simulator/kernel.py ``_run_steps``), bound per loop by :func:`load_loop`."""
    raise RuntimeError("the fleet loop runs as load_loop binds it")


_rule = rules.round_robin   # the router's rule, bound per loop by load_loop
_publish_fixed = kernel_estimates._publish_fixed     # bound per loop by load_loop (jitted)
_publish_online = kernel_online._publish_online


def _exact(whole, units):
    """whole + units * 2**-52 rounded once (units in [0, 2**52)): both terms are exact doubles, so
    their sum is correctly rounded, as ``ReplicaAccounting._exact``'s integer division is."""
    return float(whole) + float(units) * (1.0 / _UNIT)


def _recount(i, rep, routed, lo, outstanding, running, true_work, whole, units, work, predicted_reads):
    """CompiledFleet._recount of replica ``i``: counters from what its kernel landed."""
    t, st = rep[0], rep[3][0]
    running[i] = st.held - 1 - rep[4][0].n_preempted if st.held else st.n_res   # the preempted left at its start
    outstanding[i] = routed[i] - st.finished
    k = lo[i]
    while k < routed[i] and t.finish_s[k] == t.finish_s[k]:
        k += 1
    lo[i] = k
    tw = 0
    wh = 0
    un = 0
    est_route = rep[6]
    for r in range(k, routed[i]):
        if t.finish_s[r] == t.finish_s[r]:
            continue
        g = t.generated[r]
        tw += max(t.length[r] - g, 1)
        if predicted_reads:
            est = est_route[r] if t.ready_s[r] != t.ready_s[r] else t.predicted[r]
            term = max(est - g, 1.0)
            part = np.floor(term)
            un += np.int64((term - part) * float(_UNIT))
            wh += np.int64(part)
            wh += un >> 52
            un &= _UNIT - 1
    true_work[i] = tw
    whole[i] = wh
    units[i] = un
    work[i] = _exact(wh, un)


def _published(rep, st):
    """The estimates of replica ``rep``'s prefilling step just landed, published in compiled code
    as the single engine's are: fixed per row (simulator/kernel_estimates.py) or the online rule over
    its live weights (simulator/kernel_online.py), indexed by the workload's row; False when Python
    must (nothing to publish here, feedback due, an event pending, late)."""
    mode = rep[8]
    if mode == STEP_FIXED:
        return _publish_fixed(rep[9], rep[5], rep[10], rep[0], rep[1], st, rep[4][0])
    if mode == STEP_ONLINE:
        rule = rep[13]
        return _publish_online(rep[9], rep[5], rep[10], rep[11], rep[12], rule[0] != 0.0, rule[1], rule[2], rule[3],
                               rep[0], rep[1], rep[2], st, rep[4][0])
    return False


def _run_replica(rep, until, moved, i):
    """Replica ``rep``'s steps up to ``until`` (simulator/compiled_fleet.py ``run_until``); ``moved[i]``
    set when anything a router reads may have moved. Returns LOOP_DONE, or why Python must act first:
    a stall, or a stop of Python's (its status left in the replica's state)."""
    state = rep[3]
    st = state[0]
    st.until = until
    while True:   # the kernel called here alone (one call site: numba's call passes every array's fields)
        if _kernel(CHUNK, rep[0], rep[1], rep[2], state, rep[4]) > 0 or (st.held and rep[4][0].n_preempted):
            moved[i] = 1
        status = st.status
        if status == AFTER_STEP and _published(rep, st):
            continue
        if status == UNTIL:   # a held step's events that fire before the instant: Python's
            return LOOP_NEEDS_PYTHON if st.held and st.next_event < until else LOOP_DONE
        if status == DONE_OR_CHUNK:
            if st.finished == rep[0].arrival.shape[0]:
                return LOOP_DONE
            continue
        return LOOP_STALLED if status == STALLED else LOOP_NEEDS_PYTHON


def _fleet_loop(reps, arrival, prompt, length, attrs, fixed, route_est, assigned, route_global, routed, lo,
                outstanding, running, true_work, whole, units, work, rule_state, draws, balance, info,
                held_end, events, moved, predicted_reads, static):
    """The fleet's walk over its arrival instants (module docstring); ``info`` = [next row, exit,
    replica (or rows arriving, LOOP_GROW), a lower bound of the fewest free rows of a replica's table];
    per replica: when its held step ends, its next Python event (``STATE.next_event``, which only
    Python moves), whether anything a router reads moved."""
    n = arrival.shape[0]
    count = len(reps)
    next_row = info[0]
    while True:
        until = arrival[next_row] if next_row < n else np.inf
        if next_row < n:   # room in every table for the instant's rows, before any replica moves
            arriving = 1
            while next_row + arriving < n and arrival[next_row + arriving] <= until:
                arriving += 1
            if info[3] < arriving:
                room = reps[0][0].arrival.shape[0] - routed[0]
                for i in range(1, count):
                    room = min(room, reps[i][0].arrival.shape[0] - routed[i])
                info[3] = room
                if room < arriving:
                    info[0], info[1], info[2] = next_row, LOOP_GROW, arriving
                    return
        for i in range(count):
            steps = held_end[i] <= until or events[i] < until   # else the kernel would return at once
            if not steps and not moved[i]:
                continue
            rep = reps[i]   # (a copy: every array in it counted once more, so once per replica and instant)
            if steps:
                st = rep[3][0]
                exit = _run_replica(rep, until, moved, i)
                if exit != LOOP_DONE:   # Python acts (compiled_stall.python_stop), then the loop goes on from here
                    info[0], info[1], info[2] = next_row, exit, i
                    return
                held_end[i] = rep[4][0].start + rep[4][0].duration if st.held else -np.inf
            if moved[i] and next_row < n:
                _recount(i, rep, routed, lo, outstanding, running, true_work, whole, units, work, predicted_reads)
            moved[i] = 0
        if next_row >= n:
            break
        while next_row < n and arrival[next_row] <= until:
            row = next_row
            estimate = route_est[row] if predicted_reads else 0.0
            index = _rule(rule_state, outstanding, work, true_work, draws)
            if index < 0 or index >= count:
                info[0], info[1], info[2] = next_row, LOOP_NO_DRAWS, index
                return
            rep = reps[index]
            t = rep[0]
            k = routed[index]
            rep[5][k] = row
            t.arrival[k] = arrival[row]
            t.prompt[k] = prompt[row]
            t.fill[k] = prompt[row]   # KV blocks: its next prefill (the prompt array itself without them)
            rep[7][k] = prompt[row] * prompt[row]
            t.length[k] = length[row]
            for j in range(len(attrs)):
                t.attributes[j][k] = attrs[j][row]
            rep[6][k] = estimate
            route_global[row] = estimate
            routed[index] += 1
            info[3] -= 1
            assigned[row] = index
            # the accounting takes it in (its work at generated = 0, before its own estimate exists)
            outstanding[index] += 1
            true_work[index] += max(length[row], 1)
            term = max(estimate, 1.0)
            part = np.floor(term)
            units[index] += np.int64((term - part) * float(_UNIT))
            whole[index] += np.int64(part) + (units[index] >> 52)
            units[index] &= _UNIT - 1
            work[index] = _exact(whole[index], units[index])
            if static:
                t.predicted[k] = fixed[row]
            total = 0.0
            top = float(true_work[0])
            for i in range(count):
                total += float(true_work[i])
                top = max(top, float(true_work[i]))
            mean = total / count
            if mean > 0:
                balance[0] += top / mean
                balance[1] += 1.0
            next_row += 1
    info[0], info[1], info[2] = next_row, LOOP_DONE, -1


@functools.cache
def load_loop(policy_rule: str, router_rule: str):
    """The loop with the kernel of ``policy_rule`` and the router's rule ``router_rule`` (a function
    of routers/rules.py) compiled in; cached on disk by numba beside the kernel's cache, one folder
    per pair (the loop's globals differ per pair, and numba keys its cache by the function alone)."""
    import numba

    from simulator.kernel import load_kernel, numba_cache_folder

    kernel = load_kernel(policy_rule)
    online_rule.load()   # the online estimate rule compiled in place (the loop calls it)
    sources = hashlib.sha256(b"".join(Path(m.__file__ or "").read_bytes()
                                      for m in (rules, kernel_estimates, kernel_online, online_rule)))
    folder = os.path.join(numba_cache_folder(policy_rule), f"fleet-{router_rule}-{sources.hexdigest()[:12]}")
    saved, numba.config.CACHE_DIR = numba.config.CACHE_DIR, folder
    try:   # read when jitted
        jit = numba.njit(nogil=True, cache=True)
        rule_space = dict(vars(rules))
        for name in ("_lowest", "_bounded"):
            rule_space[name] = jit(_rebound(getattr(rules, name), dict(vars(rules))))
        publish_space = {**vars(kernel_estimates), **vars(kernel_online)}
        publish_space["_publish_fixed"] = jit(_rebound(_python(kernel_estimates._publish_fixed), publish_space))
        space = dict(globals())
        space["_kernel"] = kernel
        space["_rule"] = jit(_rebound(getattr(rules, router_rule), rule_space))
        space["_exact"] = jit(_exact)
        space["_recount"] = jit(_rebound(_recount, space))
        space["_publish_fixed"] = publish_space["_publish_fixed"]
        space["_publish_online"] = jit(_rebound(_python(kernel_online._publish_online), publish_space))
        inlined = numba.njit(nogil=True, cache=True, inline="always")   # per replica per instant: no call
        space["_published"] = inlined(_rebound(_published, space))
        space["_run_replica"] = inlined(_rebound(_run_replica, space))
        return jit(_rebound(_fleet_loop, space))
    finally:
        numba.config.CACHE_DIR = saved


def _python(fn):
    """The plain function of ``fn`` (a module's global that its loader may have jitted in place)."""
    return getattr(fn, "py_func", fn)


def _rebound(fn, space: dict):
    """``fn`` reading its globals from ``space`` (its helpers there are this loop's jitted ones)."""
    return types.FunctionType(fn.__code__, space, fn.__name__, fn.__defaults__, fn.__closure__)


def loop_unsupported(fleet) -> str | None:
    """Why ``fleet`` (a :class:`simulator.compiled_fleet.CompiledFleet` with its replicas' runs built)
    keeps the Python-driven walk (None: :func:`run_loop` runs it)."""
    router = fleet.router
    if type(router).compiled_rule is None:
        return f"router {router.name!r} declares no compiled rule"
    from simulator.kernel import DEFAULT_RULE

    if fleet.runs[0].rule != DEFAULT_RULE:   # mlfq, boost, priority: their kernels not yet held to the reference here
        return f"policy rule {fleet.runs[0].rule} (the loop is tested on the default rule's kernel only)"
    for index, run in enumerate(fleet.runs):
        if step_mode(run, fleet.predictors[index] if fleet.predictors else None) is None:
            return ("the predictor needs Python between steps (arrival scores, refreshes, or prefill estimates "
                    "neither fixed per row nor an online rule over precomputed rows)")
        if run.pending or run.trail is not None or run.online is not None or run.publishing is not None \
                or run.settings.record_steps:
            return "a replica's run has Python-side stops"
    if router.needs_kv:
        return "the router reads KV blocks (the loop keeps no KV counters)"
    if fleet.config.caches_prefixes:
        return "prefix caching (the loop writes no routed row's block keys)"
    if len({a.dtype for a in fleet.attributes}) > 1:
        return "request attributes of several dtypes"
    estimate = fleet.predictors[0].router_estimate() if router.reads == "predicted_work" else "prior"
    if estimate != "prior" and (estimate != "prompt" or fleet.fixed is None):
        return "the predictor gives no routing estimate fixed per row"
    return None


def step_mode(run, predictor) -> int | None:
    """How the loop makes the prefill estimates of ``run`` (a replica's, its ``predictor``'s):
    STEP_*, or None when they need Python between steps: an arrival-stage scorer (ssjf, tie, trail,
    ltr: it reads the queue at each arrival), a decode-time refresh (leap with refresh: the decode
    states' read-out), feedback without a compiled estimate rule, estimates not fixed per row."""
    from simulator.kernel_layout import PRED_NONE, PRED_PREFILL, PRED_STATIC

    if run.mode in (PRED_NONE, PRED_STATIC):
        return None if run.fb_batch or run.refresh_every else STEP_PLAIN
    if run.mode != PRED_PREFILL or run.refresh_every or run.after_prefill:
        return None
    if run.fb_batch:   # an online learner: feedback and publishes in Python, its estimates by its rule
        online = getattr(predictor, "online_estimates", None)
        return STEP_ONLINE if online is not None and online() is not None else None
    return STEP_FIXED if predictor.fixed_estimates() is not None else None


def rule_name(router) -> str:
    """The name of ``router``'s compiled rule in routers/rules.py."""
    rule = type(router).compiled_rule
    if rule is None:
        raise ValueError(f"router {router.name!r} declares no compiled rule")
    return rule.__name__


def _rep(replica, run, stepping: tuple) -> tuple:
    """What the loop holds of one replica: its kernel's arguments, its table's routing columns and
    how its prefill estimates are made (:func:`_stepping`)."""
    table = replica.parts.table
    return (run.rows, run.work, run.settings, run.state, run.batch, replica.rows, table.route_estimate,
            table.prompt_sq, *stepping)


def _stepping(fleet, index: int, shared: dict) -> tuple:
    """(STEP_* mode, estimates by workload row, publish cost, standardised rows, live weights, rule
    (square, lo, hi, cap)) of replica ``index``, the arrays the mode does not read empty. Read-only
    per-row arrays are the fleet's, held once (``shared``: by the predictor's array)."""
    run = fleet.runs[index]
    predictor = fleet.predictors[index] if fleet.predictors else None
    mode = step_mode(run, predictor)
    none, rule, rows = np.zeros(0), np.zeros(4), np.zeros((0, 0), dtype=np.float32)
    if mode == STEP_PLAIN or predictor is None:
        return STEP_PLAIN, none, np.zeros(3), rows, none, rule
    cost = kernel_estimates.publish_cost(run.driver)
    if mode == STEP_FIXED:
        fixed = predictor.fixed_estimates()
        estimates = shared.setdefault(id(fixed), np.ascontiguousarray(fixed, dtype=np.float64))
        return mode, estimates, cost, rows, none, rule
    Z, theta, square, lo, hi, cap = predictor.online_estimates()
    rows = shared.setdefault(id(Z), np.ascontiguousarray(Z, dtype=np.float32))
    scratch = shared.setdefault("scratch", np.zeros(fleet.n))   # each row's estimate, written then published
    return mode, scratch, cost, rows, theta, np.array([float(square), lo, hi, cap])


def loop_args(fleet, steppings: list[tuple]) -> tuple:
    """The compiled loop's arguments for ``fleet`` (its replicas' runs built, nothing routed yet)
    and its replicas' :func:`_stepping`."""
    import numba  # numba.typed, not imported by name: mypy would then read numba's own sources

    runs, replicas, router, acc = fleet.runs, fleet.fleet, fleet.router, fleet.accounting
    n, count = fleet.n, len(replicas)
    reps = numba.typed.List()
    for replica, run, stepping in zip(replicas, runs, steppings):
        reps.append(_rep(replica, run, stepping))
    predicted_reads = router.reads == "predicted_work"
    static = fleet.fixed is not None
    empty = np.zeros(0, dtype=np.float64)
    route_est = empty
    if predicted_reads:
        predictor = fleet.predictors[0]
        route_est = (fleet.fixed if predictor.router_estimate() == "prompt"
                     else np.full(n, float(predictor.prior_length)))
    routed = np.array([r.routed for r in replicas], dtype=np.int64)
    lo = np.array([r.lo for r in replicas], dtype=np.int64)
    whole, units = np.zeros(count, dtype=np.int64), np.zeros(count, dtype=np.int64)
    work = np.zeros(count, dtype=np.float64)
    rule_state = np.zeros(rules.STATE_SIZE, dtype=np.int64)
    balance = np.array([fleet.balance.ratio_sum, float(fleet.balance.samples)])
    info = np.array([fleet.next_row, LOOP_DONE, -1, 0], dtype=np.int64)
    return (reps, fleet.arrival, fleet.prompt, fleet.length, fleet.attributes, fleet.fixed if static else empty,
            route_est, fleet.assigned, fleet.route_estimate, routed, lo, acc.outstanding, acc.running,
            acc.true_work, whole, units, work, rule_state, router.compiled_draws(n), balance, info,
            np.full(count, -np.inf), np.array([run.st.next_event for run in runs]), np.zeros(count, dtype=np.int64),
            predicted_reads, static)


def prepare_loop(fleet):
    """The loop for ``fleet`` compiled (or loaded from numba's cache) for its arguments' types, and
    the arguments: done before the run's clock starts, as the replicas' kernels are."""
    import numba

    from core.jit import compile_lock
    from simulator.kernel import numba_cache_folder

    loop = load_loop(fleet.runs[0].rule, rule_name(fleet.router))
    shared: dict = {}
    steppings = [_stepping(fleet, index, shared) for index in range(len(fleet.runs))]
    args = loop_args(fleet, steppings)
    with compile_lock(numba_cache_folder(fleet.runs[0].rule)):   # one compile among processes starting together
        loop.compile(tuple(numba.typeof(a) for a in args))
    return loop, args, steppings


def run_loop(fleet, loop, args, steppings: list[tuple]) -> None:
    """Route and run ``fleet``'s whole workload in the compiled loop (:func:`prepare_loop`'s);
    leaves the fleet's bookkeeping as its Python walk does. The loop hands back to Python to grow a
    replica's table, or for a replica's stop that Python does (feedback, an event, a late estimate:
    :func:`simulator.compiled_stall.python_stop`), and goes on from the same instant."""
    from simulator.compiled_stall import python_stop
    from simulator.kernel_estimates import C_CPU_SPENT

    # the replicas' steppings from Python's own list: a first read of the typed list ``reps`` from Python
    # compiles numba's getitem for its items' type (~2.5 CPU-s, measured at 16 x 100,000 FCFS)
    runs, replicas, acc = fleet.runs, fleet.fleet, fleet.accounting
    reps, routed, lo, whole, units, balance, info = args[0], args[9], args[10], args[14], args[15], args[19], args[20]
    events, moved = args[22], args[23]
    loop(*args)
    while info[1] in (LOOP_GROW, LOOP_NEEDS_PYTHON):
        if info[1] == LOOP_NEEDS_PYTHON:   # the replica's predictor's CPU seconds travel with its run
            i = int(info[2])
            cost, run = steppings[i][2], runs[i]
            run.driver.cpu_s = float(cost[C_CPU_SPENT])
            python_stop(run, float(fleet.arrival[info[0]]) if info[0] < fleet.n else np.inf)
            cost[C_CPU_SPENT], events[i], moved[i] = run.driver.cpu_s, run.st.next_event, 1
        else:   # a table to grow (simulator/replica_growth.py)
            for i, replica in enumerate(replicas):
                replica.routed = int(routed[i])
            fleet.room = int(info[3])   # the loop's exact count: short of the instant's rows
            for i in fleet.make_room(int(info[2])):
                reps[i] = _rep(replicas[i], runs[i], steppings[i])
            info[3] = fleet.room
        info[1] = LOOP_DONE
        loop(*args)
    if info[1] == LOOP_STALLED:
        raise runs[int(info[2])].stalled()
    if info[1] != LOOP_DONE:
        raise RuntimeError(f"the compiled fleet loop stopped at row {int(info[0])}: the router's draws ran out")
    for i, replica in enumerate(replicas):
        replica.routed, replica.lo = int(routed[i]), int(lo[i])
        acc.set_replica(i, int(acc.outstanding[i]), int(acc.running[i]),
                        WorkSum(int(whole[i]), int(units[i]), int(acc.true_work[i])))
        if steppings[i][0] != STEP_PLAIN:
            runs[i].driver.cpu_s = float(steppings[i][2][C_CPU_SPENT])
    fleet.next_row = int(info[0])
    fleet.balance.ratio_sum, fleet.balance.samples = float(balance[0]), int(balance[1])
