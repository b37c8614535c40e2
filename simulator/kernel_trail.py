"""TRAIL inside compiled code: arrival scores, the prefill observation and decode-time refreshes.

TRAIL (:class:`predictors.trail.Trail`, stage ``arrival``, ``after_prefill``, ``refresh_every``)
otherwise hands every arrival and every step that prefills or reaches a refresh point back to
Python (~50 us a return against ~1.5 us a compiled step), which held it to a few hundred requests
per CPU-second. :func:`_run_trail` runs the kernel (:func:`simulator.kernel._run_steps`) and does
at each such stop what :class:`simulator.compiled.CompiledRun` does in Python, through the same
per-row rules the reference predictor calls (:mod:`predictors.trail_rule`), so the estimates are
the same bits. It hands the stop back to Python untouched whenever a SimPy event is pending
(TRAIL schedules none) or feedback is due (TRAIL learns nothing), so Python keeps those cases.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

from predictors import trail_rule
from simulator.kernel_layout import AFTER_STEP, DONE_OR_CHUNK, NEEDS_SCORES


class TrailCharges(NamedTuple):
    """The predictor's GPU charges as the kernel applies them (``PredictorCost``; 0 without costs)."""

    charge: bool             # PredictionDriver.charge_cost
    per_call: float
    per_request: float
    per_prompt_token: float
    per_refresh: float


def charges_of(driver) -> TrailCharges:
    c = driver.cost
    return TrailCharges(bool(driver.charge_cost), float(c.gpu_s_per_call), float(c.gpu_s_per_request),
                        float(c.gpu_s_per_prompt_token), float(c.gpu_s_per_refresh))


def _set_rows(t, w, st, rows, n_rows, a, now, rekey):
    """RequestTable.set_predictions(rows, total[rows], now); ``rekey``: also
    CompiledRun._set_estimates's list of rows the kernel moves in its order."""
    for j in range(n_rows):
        r = rows[j]
        t.predicted[r] = a.total[r]
        if t.first_predicted[r] != t.first_predicted[r]:
            t.first_predicted[r] = t.predicted[r]
            t.ready_s[r] = now
    if not rekey:
        return
    k = st.n_rekey
    if k + n_rows > w.rekey.shape[0]:   # more than the list holds: the kernel re-sorts them all
        st.n_rekey = w.rekey.shape[0]
        return
    for j in range(n_rows):
        w.rekey[k + j] = rows[j]
    st.n_rekey = k + n_rows


def _score_arrivals_trail(a, c, t, w, st):
    """CompiledRun.score_arrivals: rows [py_scored, arrived) take TRAIL's estimate now
    (``Trail.predict``: the current total); the GPU pays next step (``PredictorCost.gpu_s``)."""
    lo, hi = st.py_scored, st.arrived
    prompt_tokens = 0
    for r in range(lo, hi):
        t.predicted[r] = a.total[r]
        if t.first_predicted[r] != t.first_predicted[r]:
            t.first_predicted[r] = t.predicted[r]
            t.ready_s[r] = st.now
        prompt_tokens += t.prompt[r]
    if c.charge and hi > lo:
        st.charge += c.per_call + c.per_request * (hi - lo) + c.per_prompt_token * prompt_tokens
    st.py_scored = hi


def _after_step_trail(a, c, t, w, s, st, b):
    """CompiledRun.observe_prefill then CompiledRun.refresh for the step just landed."""
    if s.after_prefill and b.n_first:
        for j in range(b.n_first):
            trail_rule.after_prefill_row(w.firsts[j], a)
        _set_rows(t, w, st, w.firsts, b.n_first, a, st.now, True)
        if c.charge:
            st.charge += c.per_refresh * b.n_first
    if s.refresh_every:   # simulator.prediction.refresh_due, in the step's decode order
        n_due = 0
        for j in range(b.n_chosen):
            r = w.chosen[j]
            if t.generated[r] % s.refresh_every == 0 and t.generated[r] < t.length[r]:
                w.scratch[n_due] = r
                n_due += 1
        if n_due:
            for j in range(n_due):
                trail_rule.refresh_row(w.scratch[j], t.generated[w.scratch[j]], a)
            _set_rows(t, w, st, w.scratch, n_due, a, st.now, True)
            if c.charge:
                st.charge += c.per_refresh * n_due


def _run_trail(max_steps, a, c, t, w, s, state, batch):
    """Up to ``max_steps`` kernel steps, TRAIL's Python stops done here; returns the steps done,
    with the kernel's status when Python must act."""
    done = 0
    st = state[0]
    while True:
        done += _kernel(max_steps - done, t, w, s, state, batch)
        if st.next_event != math.inf or st.status == DONE_OR_CHUNK:
            return done
        if st.status == NEEDS_SCORES:
            _score_arrivals_trail(a, c, t, w, st)
        elif st.status == AFTER_STEP and not (s.feedback_batch and st.fb_n >= s.feedback_batch):
            _after_step_trail(a, c, t, w, s, st, batch[0])
        else:
            return done
        if done >= max_steps:
            st.status = DONE_OR_CHUNK
            return done


_kernel: Any = None   # the jitted kernel, set before the first compile


def compiled_trail(run, sim) -> tuple | None:
    """(arrays, charges) when ``sim``'s predictor is a bound TRAIL the kernel can drive, else None."""
    from predictors.trail import Trail
    from simulator.kernel_layout import PRED_PYTHON

    p = sim.predictor
    if not isinstance(p, Trail) or run.mode != PRED_PYTHON or run.fb_batch or not trail_rule.load():
        return None
    return p.arrays, charges_of(run.driver)


@functools.lru_cache(maxsize=1)
def load_trail_kernel():
    """The jitted :func:`_run_trail` (None without numba)."""
    global _kernel, _set_rows, _score_arrivals_trail, _after_step_trail
    from simulator.kernel import load_kernel

    kernel = load_kernel()
    if kernel is None or not trail_rule.load():
        return None
    import numba

    _kernel = kernel
    saved, numba.config.CACHE_DIR = numba.config.CACHE_DIR, wrapper_cache_folder(__name__, "predictors.trail_rule")
    try:   # as the kernel: no reference counts (it allocates nothing); cached across processes
        bare = numba.njit(nogil=True, _nrt=False, cache=True)
        _set_rows, _score_arrivals_trail, _after_step_trail = (
            bare(_set_rows), bare(_score_arrivals_trail), bare(_after_step_trail))
        return bare(_run_trail)
    finally:
        numba.config.CACHE_DIR = saved


def wrapper_cache_folder(*modules: str) -> str:
    """numba's cache folder for a wrapper around the kernel: the kernel's folder, then one named by
    the wrapper's and its rules' sources (numba re-validates a cached function by its own file only,
    so a changed rule or kernel leads to another folder)."""
    import hashlib
    import importlib
    import os
    from pathlib import Path

    from simulator.kernel import numba_cache_folder

    digest = hashlib.sha256(b"".join(Path(importlib.import_module(m).__file__ or "").read_bytes() for m in modules))
    return os.path.join(numba_cache_folder(), f"wrapper-{digest.hexdigest()[:12]}")


def advance_trail(run, max_steps: int, trail: tuple) -> int:
    """CompiledRun.advance with TRAIL driven in the kernel."""
    from simulator.kernel import DEFAULT_RULE, first_call

    arrays, charges = trail
    return int(first_call(load_trail_kernel(), DEFAULT_RULE, max_steps, arrays, charges, *run.kernel_args))

