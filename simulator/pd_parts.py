"""The parts a prefill/decode fleet adds to an engine's (docs/semantics.md "Prefill/decode
disaggregation"): a prefill instance's prediction driver, which learns from completions reported by
the decode instances; a decode instance's driver, which schedules on the estimate each request
carries from its prefill instance; and a decode instance's KV blocks, reserved for a request when its
transfer starts."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from simulator.kv_blocks import KVBlocks
from simulator.prediction import NoPrediction, PredictionDriver
from simulator.scheduler import Scheduler


class PrefillDriver(PredictionDriver):
    """A prefill instance's driver: a request finishes there at its first token, which is not its
    length, so it learns only from :meth:`learn` (the true length, sent when the request finishes on
    its decode instance)."""

    def feedback(self, done: np.ndarray) -> None:
        """Nothing: the prefill instance's completions are not the requests' ends."""


class CarriedEstimates(NoPrediction):
    """A decode instance's driver: no predictor runs here. The decode table holds the estimate each
    request carried from its prefill instance; the in-use error is counted on it, and each completion
    is reported (``report(rows, lengths)``, local rows) for the prefill instances to learn from."""

    note_decodes = PredictionDriver.note_decodes
    mae_in_use = PredictionDriver.mae_in_use

    def __init__(self, table, output_kind: str | None, report: Callable[[np.ndarray, np.ndarray], None]):
        """``output_kind``: the predictor's (None: no predictor, nothing estimated)."""
        self.table, self.output_kind, self.report = table, output_kind or "length", report
        self.track_error = output_kind == "length"
        self.in_use_abs_error, self.in_use_decodes = 0.0, 0

    def feedback(self, done: np.ndarray) -> None:
        if len(done):
            self.report(done, self.table.length[done])


class ReservedKVBlocks(KVBlocks):
    """A decode instance's KV cache: a request's prompt blocks are taken when its transfer starts
    (:meth:`reserve`), held from its landing (:meth:`landed`), and its admission (the one prompt token
    recomputed) needs no more. Preemption and re-prefill are the engine's (:class:`KVBlocks`)."""

    def __init__(self, table, total: int, size: int):
        super().__init__(table, total, size)
        self.reserved = np.zeros(table.n, dtype=bool)   # landed rows holding their reserved blocks

    def reserve(self, blocks: int) -> bool:
        """Take ``blocks`` for a transfer starting now, if they are free."""
        if blocks > self.free:
            return False
        self.used += blocks
        return True

    def landed(self, row: int, blocks: int) -> None:
        self.held[row] = blocks
        self.reserved[row] = True

    def _need(self, rows: np.ndarray) -> np.ndarray:
        return np.where(self.reserved[rows], 0, self.blocks(self.table.fill[rows]))

    def admissible(self, rows: np.ndarray) -> int:
        return int(np.searchsorted(np.cumsum(self._need(rows)), self.free, side="right"))

    def hold(self, rows: np.ndarray) -> None:
        fresh = rows[~self.reserved[rows]]
        need = self.blocks(self.table.fill[fresh])
        self.held[fresh] = need
        self.used += int(need.sum())
        self.reserved[rows] = False
        if self.used > self.total:
            raise AssertionError(f"KV blocks over-committed: {self.used} of {self.total}")


class DecodeScheduler(Scheduler):
    """A decode instance's scheduler: a landed request (its blocks reserved before its transfer) is
    admitted before the preempted requests, which need blocks: the engine's order (preempted first)
    would leave both waiting when the preempted one's blocks are held by landed ones."""

    def idle(self, arrived: int) -> bool:
        """Also idle: nothing resident or landed, and the next preempted request's blocks are reserved
        for transfers still in flight (it waits for their landings, which wake the instance)."""
        if super().idle(arrived):
            return True
        t, kv = self.table, self.kv
        if kv is None or len(t.resident) or t.partial >= 0 or self.admit_ptr < arrived or not kv.requeued:
            return False
        return int(kv.blocks(t.fill[kv.requeued[-1]])) > kv.free

    def _admit(self, arrived: int, budget: int, may_admit: bool = True) -> tuple[np.ndarray, np.ndarray]:
        kv = self.kv
        if kv is None or not kv.requeued or self.admit_ptr >= arrived:
            return super()._admit(arrived, budget, may_admit)
        requeued, kv.requeued = kv.requeued, []
        try:
            return super()._admit(arrived, budget, may_admit)
        finally:
            kv.requeued = requeued
