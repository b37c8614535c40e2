"""Why a compiled run stopped, and Python's part of a stop: the kernel's stall worded as the
reference engine words it; the scores, estimates and events a replica's kernel hands to Python
(a fleet's walk and its compiled loop both call :func:`python_stop`)."""

from __future__ import annotations

import heapq

from simulator.kernel_layout import AFTER_STEP, NEEDS_EVENT, NEEDS_SCORES, UNTIL
from simulator.scheduler import SimulationStalled, chunk_overrun, min_chunk


def stalled(run) -> Exception:
    """The :class:`simulator.scheduler.SimulationStalled` of the kernel's stall, as the reference words it."""
    if run.st.chunk_overrun:
        row = int(run.st.partial)
        return SimulationStalled(chunk_overrun(run.steps, run.now, row, int(run.table.fill[row]),
                                               int(run.table.prefilled[row]), int(run.st.carried_chunks), min_chunk(run.cfg)))
    if run.st.stall_ready < 0:   # kernel: a carried chunk computed nothing
        row, before = -1 - int(run.st.stall_ready), int(run.st.stall_waiting)
        return SimulationStalled(
            f"step {run.steps} at t={run.now:.6g} s made no progress: the part-prefilled prompt of row "
            f"{row} stayed at {before} of {int(run.table.fill[row])} tokens, nothing admitted or decoded")
    return SimulationStalled(
        f"step {run.steps} at t={run.now:.6g} s admitted and decoded nothing with "
        f"{int(run.st.stall_ready)} resident and {int(run.st.stall_waiting)} waiting requests "
        f"(decode_slots={run.cfg.decode_slots}, max_resident={run.cfg.max_resident})")


def python_stop(run, until: float) -> bool:
    """Python's part of the stop the kernel of ``run`` made on its way to ``until``: scores, a
    step's estimates and feedback, due events; at ``until`` with a step held over it, the events
    that fire before ``until`` while it runs. Returns whether anything a router reads may have moved."""
    status = run.st.status
    if status == NEEDS_SCORES:
        run.score_arrivals()
    elif status == AFTER_STEP:
        run.after_step()
    elif status == NEEDS_EVENT:
        run.fire_due()
    elif status == UNTIL:
        fired = False
        if run.st.held:
            while run.pending and run.pending[0][0] < until:
                at, _, _, what = heapq.heappop(run.pending)
                run._fire(at, what, before_landing=False)
                fired = True
            run._next_event()
        return fired
    else:
        raise run.stalled()
    return True
