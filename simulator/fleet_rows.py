"""A replica's view of a predictor bound to the whole workload: the replica's local rows (its
requests in arrival order) translated to the workload's rows, so one bound predictor can answer
for one replica (its own state) or for every replica (static estimates, nothing to keep apart)."""

from __future__ import annotations

import numpy as np

from predictors.base import Known, PendingUpdate, Predictor


class ReplicaRows:
    """What :class:`simulator.prediction.PredictionDriver` asks of a predictor, for one replica."""

    def __init__(self, predictor: Predictor, rows: np.ndarray):
        self.predictor = predictor
        self.rows = rows   # global row of each local row; filled by the fleet as it routes
        self.output, self.stage = predictor.output, predictor.stage
        self.refresh_every = predictor.refresh_every
        self.feedback_batch = predictor.feedback_batch

    @property
    def prior_length(self) -> float:
        return self.predictor.prior_length

    def predict(self, rows: np.ndarray, known: Known | None = None) -> np.ndarray:
        return self.predictor.predict(self.rows[rows], known)

    def after_prefill(self, rows: np.ndarray) -> np.ndarray | None:
        return self.predictor.after_prefill(self.rows[rows])

    def refresh(self, rows: np.ndarray, generated: np.ndarray) -> np.ndarray:
        return self.predictor.refresh(self.rows[rows], generated)

    def feedback(self, rows: np.ndarray, lengths: np.ndarray) -> PendingUpdate | None:
        return self.predictor.feedback(self.rows[rows], lengths)
