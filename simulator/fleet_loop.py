"""The compiled fleet loop: every replica's kernel and the routing in one numba function.

:class:`simulator.compiled_fleet.CompiledFleet` walks the fleet's arrival instants in Python and
calls each replica's kernel once per instant (about 20 us a call). When the run needs no Python
between steps and its router declares a compiled rule (``Router.compiled_rule``, routers/rules.py),
:func:`run_loop` does the same walk inside compiled code instead: before each arrival instant every
replica's kernel runs up to it (``STATE.until``, as :func:`simulator.compiled_fleet.run_until`), the
replicas whose steps landed recount their counters (:meth:`CompiledFleet._recount`), and each
arrival at that instant is routed by the rule, joins its replica's table (attributes included) and
the accounting, and the balance is sampled (routers/snapshot.py), in the reference fleet's order.

It runs when (:func:`loop_unsupported`): the router has a compiled rule; no replica's predictor needs
Python between steps: no predictor, or estimates fixed per row at bind time (``static_estimates``:
oracle, noisy-oracle) that neither learn online nor refresh. Every other predictor keeps the
Python-driven path: arrival-stage scorers that read the queue (ssjf, tie, trail, ltr) are scored in
Python at each arrival, prefill-stage ones (leap, leap-rls, egtp) predict from the prompt's hidden
state in Python after its prefill, and leap-rls's RLS updates are Python events on a worker's clock.
The single engine compiles LEAP+RLS's prefill estimates (simulator/kernel_online.py), but those
index the workload's rows, not a replica's (the fleet turns them off: ``fast_paths=False``).
"""

from __future__ import annotations

import functools
import os
import types

import numpy as np

from routers import rules
from routers.snapshot import WorkSum
from simulator.kernel_layout import DONE_OR_CHUNK, STALLED, UNTIL

#: the loop's exit (``info[1]``): done; a replica stalled; a replica needs Python; the router's draws ran
#: out; a replica's table has no room for the next instant's rows (Python grows it, the loop goes on)
LOOP_DONE, LOOP_STALLED, LOOP_NEEDS_PYTHON, LOOP_NO_DRAWS, LOOP_GROW = 0, 1, 2, 3, 4
CHUNK = 1 << 16
_UNIT = 1 << 52   # fractions of predicted work, in units of 2**-52 (routers/snapshot.py FRACTION_BITS)


def _kernel(max_steps, t, w, s, state, batch):
    """The replicas' step kernel (simulator/kernel.py ``_run_steps``), bound per loop by :func:`load_loop`."""
    raise RuntimeError("the fleet loop runs as load_loop binds it")


_rule = rules.round_robin   # the router's rule, bound per loop by load_loop


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


def _fleet_loop(reps, arrival, prompt, length, attrs, fixed, route_est, assigned, route_global, routed, lo,
                outstanding, running, true_work, whole, units, work, rule_state, draws, balance, info,
                held_end, predicted_reads, static):
    """The fleet's walk over its arrival instants (module docstring); ``info`` = [next row, exit,
    replica (or rows arriving, LOOP_GROW), a lower bound of the fewest free rows of a replica's table]."""
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
            if held_end[i] > until:   # its held step lands after the instant: the kernel would return at once
                continue
            rep = reps[i]
            state = rep[3]
            st = state[0]
            st.until = until
            moved = False
            while True:
                if _kernel(CHUNK, rep[0], rep[1], rep[2], state, rep[4]) > 0 or (st.held and rep[4][0].n_preempted):
                    moved = True
                status = st.status
                if status == UNTIL or (status == DONE_OR_CHUNK and st.finished == rep[0].arrival.shape[0]):
                    break
                if status != DONE_OR_CHUNK:
                    info[0], info[1], info[2] = next_row, LOOP_STALLED if status == STALLED else LOOP_NEEDS_PYTHON, i
                    return
            held_end[i] = rep[4][0].start + rep[4][0].duration if st.held else -np.inf
            if moved and next_row < n:
                _recount(i, rep, routed, lo, outstanding, running, true_work, whole, units, work, predicted_reads)
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
    folder = os.path.join(numba_cache_folder(policy_rule), f"fleet-{router_rule}")
    saved, numba.config.CACHE_DIR = numba.config.CACHE_DIR, folder
    try:   # read when jitted
        jit = numba.njit(nogil=True, cache=True)
        rule_space = dict(vars(rules))
        for name in ("_lowest", "_bounded"):
            rule_space[name] = jit(_rebound(getattr(rules, name), dict(vars(rules))))
        space = dict(globals())
        space["_kernel"] = kernel
        space["_rule"] = jit(_rebound(getattr(rules, router_rule), rule_space))
        space["_exact"] = jit(_exact)
        space["_recount"] = jit(_rebound(_recount, space))
        return jit(_rebound(_fleet_loop, space))
    finally:
        numba.config.CACHE_DIR = saved


def _rebound(fn, space: dict):
    """``fn`` reading its globals from ``space`` (its helpers there are this loop's jitted ones)."""
    return types.FunctionType(fn.__code__, space, fn.__name__, fn.__defaults__, fn.__closure__)


def loop_unsupported(fleet) -> str | None:
    """Why ``fleet`` (a :class:`simulator.compiled_fleet.CompiledFleet` with its replicas' runs built)
    keeps the Python-driven walk (None: :func:`run_loop` runs it)."""
    from simulator.kernel_layout import PRED_NONE, PRED_STATIC

    router = fleet.router
    if type(router).compiled_rule is None:
        return f"router {router.name!r} declares no compiled rule"
    from simulator.kernel import DEFAULT_RULE

    if fleet.runs[0].rule != DEFAULT_RULE:   # mlfq, boost, priority: their kernels not yet held to the reference here
        return f"policy rule {fleet.runs[0].rule} (the loop is tested on the default rule's kernel only)"
    for run in fleet.runs:
        if run.mode not in (PRED_NONE, PRED_STATIC) or run.fb_batch or run.refresh_every or run.after_prefill:
            return "the predictor needs Python between steps (scores, prefill estimates, refreshes or feedback)"
        if run.pending or run.trail is not None or run.online is not None or run.publishing is not None \
                or run.settings.record_steps:
            return "a replica's run has Python-side stops"
    if router.needs_kv:
        return "the router reads KV blocks (the loop keeps no KV counters)"
    if fleet.config.caches_prefixes:
        return "prefix caching (the loop writes no routed row's block keys)"
    if len({a.dtype for a in fleet.attributes}) > 1:
        return "request attributes of several dtypes"
    if router.reads == "predicted_work" and fleet.predictors[0].router_estimate() not in ("prompt", "prior"):
        return "the predictor gives no routing estimate"
    return None


def rule_name(router) -> str:
    """The name of ``router``'s compiled rule in routers/rules.py."""
    rule = type(router).compiled_rule
    if rule is None:
        raise ValueError(f"router {router.name!r} declares no compiled rule")
    return rule.__name__


def _rep(replica, run) -> tuple:
    """What the loop holds of one replica: its kernel's arguments and its table's routing columns."""
    table = replica.parts.table
    return (run.rows, run.work, run.settings, run.state, run.batch, replica.rows, table.route_estimate,
            table.prompt_sq)


def loop_args(fleet) -> tuple:
    """The compiled loop's arguments for ``fleet`` (its replicas' runs built, nothing routed yet)."""
    import numba  # numba.typed, not imported by name: mypy would then read numba's own sources

    runs, replicas, router, acc = fleet.runs, fleet.fleet, fleet.router, fleet.accounting
    n, count = fleet.n, len(replicas)
    reps = numba.typed.List()
    for replica, run in zip(replicas, runs):
        reps.append(_rep(replica, run))
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
            np.full(count, -np.inf), predicted_reads, static)


def prepare_loop(fleet):
    """The loop for ``fleet`` compiled (or loaded from numba's cache) for its arguments' types, and
    the arguments: done before the run's clock starts, as the replicas' kernels are."""
    import numba

    from core.jit import compile_lock
    from simulator.kernel import numba_cache_folder

    loop = load_loop(fleet.runs[0].rule, rule_name(fleet.router))
    args = loop_args(fleet)
    with compile_lock(numba_cache_folder(fleet.runs[0].rule)):   # one compile among processes starting together
        loop.compile(tuple(numba.typeof(a) for a in args))
    return loop, args


def run_loop(fleet, loop, args) -> None:
    """Route and run ``fleet``'s whole workload in the compiled loop (:func:`prepare_loop`'s);
    leaves the fleet's bookkeeping as its Python walk does."""
    runs, replicas, acc = fleet.runs, fleet.fleet, fleet.accounting
    reps, routed, lo, whole, units, balance, info = args[0], args[9], args[10], args[14], args[15], args[19], args[20]
    loop(*args)
    while info[1] == LOOP_GROW:   # a table to grow (simulator/replica_growth.py), then on from the same instant
        for i, replica in enumerate(replicas):
            replica.routed = int(routed[i])
        fleet.room = int(info[3])   # the loop's exact count: short of the instant's rows
        for i in fleet.make_room(int(info[2])):
            reps[i] = _rep(replicas[i], runs[i])
        info[1], info[3] = LOOP_DONE, fleet.room
        loop(*args)
    if info[1] == LOOP_STALLED:
        raise runs[int(info[2])].stalled()
    if info[1] != LOOP_DONE:
        raise RuntimeError(f"the compiled fleet loop stopped at row {int(info[0])}: "
                           + ("a replica needs Python" if info[1] == LOOP_NEEDS_PYTHON else "the router's draws ran out"))
    for i, replica in enumerate(replicas):
        replica.routed, replica.lo = int(routed[i]), int(lo[i])
        acc.set_replica(i, int(acc.outstanding[i]), int(acc.running[i]),
                        WorkSum(int(whole[i]), int(units[i]), int(acc.true_work[i])))
    fleet.next_row = int(info[0])
    fleet.balance.ratio_sum, fleet.balance.samples = float(balance[0]), int(balance[1])

