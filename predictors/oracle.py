"""The oracle: the true output length. An explicit upper-bound baseline, never a default."""

from __future__ import annotations

import numpy as np

from predictors.base import Predictor


class Oracle(Predictor):
    name = "oracle"
    stage = "arrival"
    live = True
    sees_true_lengths = True
    static_estimates = True
    compiled = scores_at_arrival = serves_router = True

    def bind(self, workload, rng):
        super().bind(workload, rng)
        self._truth = workload.output_tokens.astype(np.float64)

    def predict(self, rows, known=None):
        return self._truth[rows]

    @property
    def prior_length(self) -> float:
        return float(np.mean(self._truth))
