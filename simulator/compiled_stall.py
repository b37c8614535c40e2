"""Why a compiled run stopped: the kernel's stall worded as the reference engine words it."""

from __future__ import annotations

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
