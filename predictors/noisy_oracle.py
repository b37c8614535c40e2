"""The true length plus Gaussian noise of a chosen mean absolute error (scheduling sensitivity).

Noise ~ N(0, sigma) with sigma = MAE * sqrt(pi / 2), so E|noise| = MAE (TRAIL+'s construction);
estimates are floored at 1 token. Drawn once per request at bind time from the run's seed.
"""

from __future__ import annotations

import math

import numpy as np

from predictors.base import Predictor, PredictorOptions


class NoisyOracle(Predictor):
    name = "noisy-oracle"
    stage = "arrival"
    sees_true_lengths = True
    static_estimates = True
    compiled = scores_at_arrival = serves_router = True

    def __init__(self, noise_mae: float = 0.0):
        self.noise_mae = float(noise_mae)

    @classmethod
    def from_options(cls, options: PredictorOptions):
        return cls(options.noise_mae)

    def bind(self, workload, rng):
        super().bind(workload, rng)
        sigma = self.noise_mae * math.sqrt(math.pi / 2)
        truth = workload.output_tokens.astype(np.float64)
        self._estimate = np.maximum(truth + rng.normal(0.0, sigma, size=len(truth)) if sigma else truth, 1.0)

    def predict(self, rows, known=None):
        return self._estimate[rows]

    @property
    def prior_length(self) -> float:
        return float(np.mean(self._estimate))

    def describe(self):
        return {"name": self.name, "noise_mae": self.noise_mae}
