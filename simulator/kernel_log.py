"""The compiled step's log: the per-step record the reference keeps when asked (``record_steps``).

:func:`_record_step` is ``simulator.engine.StepLog.record`` and :func:`_record_finished` the
``StepLog.finished`` append after the step's retire: one row per step of ``Work.log_times``
(start, duration) and ``Work.log_counts`` (the ``LOG_*`` columns), indexed by the step. Python
(:mod:`simulator.compiled_log`) grows the arrays before each kernel call and turns them into the
reference's :class:`simulator.engine.StepLog` at the end. Plain Python that numba compiles.
"""

from __future__ import annotations

from simulator.kernel_layout import (
    LOG_ADMITTED,
    LOG_ARRIVED,
    LOG_CAPACITY_LEFT,
    LOG_DECODED,
    LOG_FINISHED,
    LOG_FORCED,
    LOG_READY,
    LOG_RESIDENT,
    LOG_WAITING,
)


def _record_step(w, s, st, b, ready, start, duration):
    """StepLog.record: the step about to run (``ready``: residents able to decode at its start); a
    carried chunk holds a resident place; preempted rows leave, readmitted ones hold one again."""
    if not s.record_steps:
        return
    i = st.step
    holding = ready + b.n_admit + (1 if b.carried >= 0 else 0) + b.n_readmit - b.n_preempted
    w.log_times[i, 0] = start
    w.log_times[i, 1] = duration
    counts = w.log_counts
    counts[i, LOG_ADMITTED] = b.n_admit
    counts[i, LOG_DECODED] = b.n_chosen
    counts[i, LOG_FORCED] = b.n_forced
    counts[i, LOG_READY] = ready
    counts[i, LOG_RESIDENT] = holding
    counts[i, LOG_ARRIVED] = st.arrived
    counts[i, LOG_CAPACITY_LEFT] = s.max_resident - holding
    counts[i, LOG_WAITING] = b.waiting - b.n_admit - b.n_readmit   # Batch.waiting: after this step's admissions


def _record_finished(w, s, st):
    """The ``StepLog.finished`` append: requests finished by the end of the step just landed."""
    if s.record_steps:
        w.log_counts[st.step, LOG_FINISHED] = st.finished


JITTED = ("_record_step", "_record_finished")
