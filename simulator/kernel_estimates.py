"""Prefill estimates fixed at bind time, published inside compiled code.

A prefill-stage predictor whose estimate of a row never changes once it is bound (frozen ``leap``,
``egtp``: a read-out of fixed features computed for the whole trace in ``bind``) needs no Python
call after a prefilling step: :func:`_run_publishing_fixed` runs the kernel
(:func:`simulator.kernel._run_steps`) and, each time it stops after such a step, does what
:meth:`simulator.compiled.CompiledRun.predict_after_prefill` does, with the same float64
arithmetic in the same order, then runs the kernel on. It hands the step back to Python untouched
when the estimate is ready only after the step's end (a SimPy event is due) or when an earlier
event is pending, so Python keeps every case with events. Without it each prefilling step costs
a return to Python (~25 us of call overhead against ~1 us of compiled step), which held frozen
``leap`` to a third of the engine's rate.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from simulator.kernel import load_kernel
from simulator.kernel_layout import AFTER_STEP, DONE_OR_CHUNK

# float settings of the publish (the `cost` array): CPU seconds per prediction (0 without costs),
# the share of a prefill step done when the tapped layer is reached, and the predictor's CPU seconds
# spent so far (PredictionDriver.cpu_s, carried across calls)
C_CPU_PER_PREDICTION, C_TAP_FRACTION, C_CPU_SPENT = range(3)


def publish_cost(driver) -> np.ndarray:
    """The ``cost`` array of a publish for ``driver`` (a prefill-stage predictor's PredictionDriver)."""
    cost = np.zeros(3, dtype=np.float64)
    cost[C_CPU_PER_PREDICTION] = driver.cost.cpu_s_per_prediction if driver.charge_cost else 0.0
    cost[C_TAP_FRACTION] = driver.cost.tap_fraction
    cost[C_CPU_SPENT] = driver.cpu_s
    return cost


def _publish_fixed(estimates, source, cost, t, w, st, b):
    """CompiledRun.predict_after_prefill for the step just landed, when its estimates are ready by
    the step's end; returns False (nothing touched) when they are not, or an event is pending.
    ``estimates`` is indexed by the workload's row, ``source[r]`` of the table's row ``r`` (a fleet's
    replica holds its requests' rows; the single engine: the identity)."""
    n_first = b.n_first
    start, duration = b.start, b.duration
    cpu = cost[C_CPU_PER_PREDICTION] * n_first
    ready = start + cost[C_TAP_FRACTION] * duration + cpu
    end = start + duration
    if st.next_event != math.inf or not ready <= end:   # an event is pending, or the estimate is late
        return False
    cost[C_CPU_SPENT] += cpu
    for j in range(n_first):      # RequestTable.set_predictions(rows, estimates[rows], end)
        r = w.firsts[j]
        t.predicted[r] = estimates[source[r]]
        if t.first_predicted[r] != t.first_predicted[r]:
            t.first_predicted[r] = t.predicted[r]
            t.ready_s[r] = end
    k = st.n_rekey                # CompiledRun._set_estimates: the kernel moves them in its order
    if k + n_first > w.rekey.shape[0]:
        st.n_rekey = w.rekey.shape[0]
    else:
        for j in range(n_first):
            w.rekey[k + j] = w.firsts[j]
        st.n_rekey = k + n_first
    return True


def _run_publishing_fixed(max_steps, estimates, source, cost, t, w, s, state, batch):
    """Up to ``max_steps`` kernel steps; after a prefilling step its fixed estimates are published
    here unless Python must (then the kernel's AFTER_STEP status is returned)."""
    done = 0
    st = state[0]
    while True:
        done += _kernel(max_steps - done, t, w, s, state, batch)
        if st.status != AFTER_STEP or not _publish_fixed(estimates, source, cost, t, w, st, batch[0]):
            return done
        if done >= max_steps:
            st.status = DONE_OR_CHUNK
            return done


_kernel: Any = None   # the jitted kernel, set before the first compile


@functools.lru_cache(maxsize=1)
def load_publishing_kernel():
    """The jitted :func:`_run_publishing_fixed` (None without numba)."""
    global _kernel, _publish_fixed
    kernel = load_kernel()
    if kernel is None:
        return None
    import numba

    _kernel = kernel
    bare = numba.njit(nogil=True, _nrt=False)   # as the kernel: no reference counts (it allocates nothing)
    _publish_fixed = bare(_publish_fixed)
    return bare(_run_publishing_fixed)
