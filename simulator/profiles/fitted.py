"""Step time fitted by least squares to the per-step timings a capture run recorded.

step_s ~ a + b * prefill_tokens + c * decode_requests + d * decode_context (+ e * prefill_sq),
with each coefficient >= 0 (a feature whose coefficient comes out negative is dropped and the
rest refitted), using whichever of those columns the trace's ``steps`` table has. Lets a user
replay a trace under the engine they actually measured.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from simulator.profiles.base import EngineProfile

FEATURES = ("prefill_tokens", "decode_requests", "decode_context", "prefill_sq")


class FittedProfile(EngineProfile):
    name = "fitted"

    def __init__(self, coefficients: dict[str, float], *, source: str = "", rows: int = 0, r2: float = float("nan")):
        self.coefficients = {k: float(v) for k, v in coefficients.items()}
        self.source, self.rows, self.r2 = source, rows, r2
        self._a = self.coefficients.get("intercept", 0.0)
        self._w = [self.coefficients.get(f, 0.0) for f in FEATURES]

    @classmethod
    def fit(cls, steps: pa.Table, source: str = "") -> "FittedProfile":
        y = steps.column("step_s").to_numpy(zero_copy_only=False).astype(np.float64)
        present = [f for f in FEATURES if f in steps.column_names]
        if len(y) < len(present) + 2:
            raise ValueError(f"steps table of {source or 'trace'} has {len(y)} rows: too few to fit a step-time profile")
        cols = {f: steps.column(f).to_numpy(zero_copy_only=False).astype(np.float64) for f in present}
        active = list(present)
        while True:
            X = np.column_stack([np.ones_like(y)] + [cols[f] for f in active])
            coef, *_ = np.linalg.lstsq(X, y, rcond=None)
            negative = [f for f, c in zip(active, coef[1:]) if c < 0]
            if not negative:
                break
            active.remove(negative[0])
        fitted = X @ coef
        ss_res = float(np.sum((y - fitted) ** 2))
        ss_tot = float(np.sum((y - y.mean()) ** 2)) or 1.0
        coefficients = {"intercept": max(float(coef[0]), 0.0), **dict(zip(active, map(float, coef[1:])))}
        return cls(coefficients, source=source, rows=len(y), r2=1.0 - ss_res / ss_tot)

    def step_time(self, prefill_tokens, prefill_sq, decode_batch, decode_context) -> float:
        w = self._w
        t = self._a + w[0] * prefill_tokens + w[1] * decode_batch + w[2] * decode_context + w[3] * prefill_sq
        return t if t > 1e-9 else 1e-9

    def describe(self) -> dict:
        return {"name": self.name, "coefficients": self.coefficients, "source": self.source,
                "rows": self.rows, "r2": self.r2}
