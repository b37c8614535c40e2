"""LEAP+RLS's prefill estimates inside compiled code, from the weights published so far.

An online-learning prefill-stage predictor that declares ``online_estimates()`` (LEAP+RLS: its
standardised rows, its published weights, written in place at each publish, and its estimate rule
:mod:`predictors.leap.online_rule`) needs Python only for feedback and publishes: a prefilling
step's estimates are the rule applied to the weights live now. :func:`_run_publishing_online` runs
the kernel and, when it stops after a prefilling step with no feedback due, computes those rows'
estimates with the same rule the reference predictor calls, then publishes them exactly as
:mod:`simulator.kernel_estimates` publishes fixed ones (its ``_publish_fixed``: on time, no event
pending; otherwise the stop goes back to Python untouched). Without it each prefilling step costs
a return to Python (~200 us with the predictor's call against ~1.5 us a compiled step).
"""

from __future__ import annotations

import functools
from typing import Any

from predictors.leap import online_rule
from simulator import kernel_estimates
from simulator.kernel_layout import AFTER_STEP, DONE_OR_CHUNK


def _publish_online(estimates, source, cost, Z, theta, square, lo, hi, cap, t, w, s, st, b):
    """The estimates of the prefilling step just landed (the rule over the published weights),
    published as fixed ones are (``_publish_fixed``); False when Python must: feedback due, an event
    pending, late (the estimates buffer may be written then, the table is not)."""
    if s.feedback_batch and st.fb_n >= s.feedback_batch:
        return False
    for j in range(b.n_first):
        r = source[w.firsts[j]]   # the workload's row (Z's and the estimates')
        estimates[r] = online_rule.estimate_row(Z, r, theta, square, lo, hi, cap)
    return _publish_fixed(estimates, source, cost, t, w, st, b)


def _run_publishing_online(max_steps, estimates, source, cost, Z, theta, square, lo, hi, cap, t, w, s, state, batch):
    """Up to ``max_steps`` kernel steps; a prefilling step's estimates are published here unless
    Python must (:func:`_publish_online`)."""
    done = 0
    st = state[0]
    while True:
        done += _kernel(max_steps - done, t, w, s, state, batch)
        if st.status != AFTER_STEP or not _publish_online(estimates, source, cost, Z, theta, square, lo, hi, cap,
                                                          t, w, s, st, batch[0]):
            return done
        if done >= max_steps:
            st.status = DONE_OR_CHUNK
            return done


_kernel: Any = None          # the jitted kernel and publish, set before the first compile
_publish_fixed: Any = None


def compiled_online(run, sim) -> tuple | None:
    """(estimates buffer, source rows (the identity), cost, rows, weights, rule settings) when
    ``sim``'s predictor is a prefill-stage online learner that declares ``online_estimates``, else None."""
    import numpy as np

    from simulator.kernel_estimates import publish_cost
    from simulator.kernel_layout import PRED_PREFILL

    declared = getattr(sim.predictor, "online_estimates", None)
    online = declared() if declared is not None and run.mode == PRED_PREFILL and not run.refresh_every else None
    if online is None or not online_rule.load():
        return None
    n = run.table.n
    return (np.zeros(n, dtype=np.float64), np.arange(n, dtype=np.int64), publish_cost(run.driver), *online)


@functools.lru_cache(maxsize=1)
def load_online_kernel():
    """The jitted :func:`_run_publishing_online` (None without numba)."""
    global _kernel, _publish_fixed, _publish_online
    from simulator.kernel import load_kernel

    kernel = load_kernel()
    if kernel is None or kernel_estimates.load_publishing_kernel() is None or not online_rule.load():
        return None
    import numba

    from simulator.kernel_trail import wrapper_cache_folder

    _kernel, _publish_fixed = kernel, kernel_estimates._publish_fixed   # the jitted publish
    saved = numba.config.CACHE_DIR
    numba.config.CACHE_DIR = wrapper_cache_folder(__name__, "predictors.leap.online_rule", "simulator.kernel_estimates")
    try:   # cached across processes, in a folder named by its sources and its rule's
        jit = numba.njit(nogil=True, _nrt=False, cache=True)
        _publish_online = jit(_publish_online)
        return jit(_run_publishing_online)
    finally:
        numba.config.CACHE_DIR = saved


def advance_online(run, max_steps: int, online: tuple) -> int:
    """CompiledRun.advance with the prefill estimates made in the kernel (the driver's CPU seconds
    carried through ``cost`` as for fixed estimates)."""
    from simulator.kernel import DEFAULT_RULE, first_call
    from simulator.kernel_estimates import C_CPU_SPENT

    cost = online[2]
    cost[C_CPU_SPENT] = run.driver.cpu_s
    done = first_call(load_online_kernel(), DEFAULT_RULE, max_steps, *online, *run.kernel_args)
    run.driver.cpu_s = float(cost[C_CPU_SPENT])
    return int(done)
