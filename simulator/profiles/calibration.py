"""The profile fitted on a calibration (``leap-serve calibrate``: a designed grid of engine steps),
``--engine fitted:BASE.calibration.json``. The files themselves (format, reading, writing, a
check's speed) are ``core.calibration_files``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from core.calibration_files import read_calibration
from simulator.profiles.fitted import FEATURES, FittedProfile, _nonnegative_lstsq


@dataclass(frozen=True)
class Calibration:
    """A calibration (or check) run. Quacks like a trace where a profile source is expected
    (``name``, ``path``, ``steps``, ``metadata``; no request table)."""

    name: str
    path: Path
    steps: pa.Table
    metadata: dict
    table: None = None

    @property
    def kind(self) -> str:
        return str(self.metadata.get("kind"))

    def profile(self) -> FittedProfile:
        return fit_relative(self.steps, source=self.name,
                            note=f"fitted on calibration {self.name} (leap-serve calibrate), relative error")

    def at_speed(self, ratio: float) -> Calibration:
        """The same calibration with every step ``ratio`` times as long (host gap unchanged): the
        least-squares profile fitted on it is this one's with its coefficients scaled by ``ratio``."""
        step = pa.array(self.steps.column("step_s").to_numpy(zero_copy_only=False) * float(ratio), pa.float64())
        steps = self.steps.set_column(self.steps.column_names.index("step_s"), "step_s", step)
        return Calibration(f"{self.name}@{ratio:.4f}x", self.path, steps,
                           {**self.metadata, "scaled_by": float(ratio)})


def fit_relative(steps: pa.Table, source: str, note: str) -> FittedProfile:
    """The ``fitted`` profile's model (same features, coefficients >= 0) fitted to minimise the
    *relative* error of each step: a grid spans 0.03 s decodes to multi-second prefills, and plain
    least squares would fit the few long steps at the expense of the many short ones (the live
    runs' steps), whose ratio to the model is what a replay depends on."""
    y = steps.column("step_s").to_numpy(zero_copy_only=False).astype(np.float64)
    present = [f for f in FEATURES if f in steps.column_names]
    X = np.column_stack([np.ones(len(y))] + [steps.column(f).to_numpy(zero_copy_only=False).astype(np.float64)
                                             for f in present])
    ok = y > 0
    if ok.sum() < len(present) + 2:
        raise ValueError(f"calibration {source}: {int(ok.sum())} timed steps, too few to fit a profile")
    w = 1.0 / y[ok]
    coef, active = _nonnegative_lstsq(X[ok] * w[:, None], y[ok] * w, present)
    fitted = X[:, [0] + [present.index(f) + 1 for f in active]] @ coef
    ss_res = float(np.sum((y[ok] - fitted[ok]) ** 2))
    ss_tot = float(np.sum((y[ok] - y[ok].mean()) ** 2)) or 1.0
    gap = steps.column("host_gap_s").to_numpy(zero_copy_only=False).astype(np.float64)
    host_gap = float(np.nanmean(np.maximum(gap, 0.0))) if np.isfinite(gap).any() else 0.0
    coefficients = {"intercept": max(float(coef[0]), 0.0), **dict(zip(active, map(float, coef[1:])))}
    return FittedProfile(coefficients, source=source, rows=int(ok.sum()), r2=1.0 - ss_res / ss_tot,
                         host_gap_s=host_gap, runs_used=[0], note=note)


def load_calibration(path: str | Path) -> Calibration:
    """A calibration pair (``core.calibration_files.read_calibration``) with its fitted profile."""
    return Calibration(*read_calibration(path))
