"""Step time fitted by least squares to the per-step timings a capture run recorded.

step_s ~ a + b * prefill_tokens + c * decode_requests + d * decode_context + e * prefill_sq,
with each coefficient >= 0 (a feature whose coefficient comes out negative is dropped and the
rest refitted), using whichever of those columns the trace's ``steps`` table has
(``decode_context`` and ``prefill_sq`` are rebuilt for old recordings by
``experiments/steps_rebuild.py``). Lets a user replay a trace under the engine they actually measured.

What is fitted on, and why:
- Only steps whose composition is known exactly (``rebuilt_exact`` where the table has it).
- Only clean runs. A recording may span several runs (resumed captures); a run on a contended host
  is slow throughout or drifts (alpaca runs 1-2 ran ~7x slow). After a first fit on every run,
  a run is *contended* when the median of measured / fitted step time over any quarter of the run
  lies outside [1 / DRIFT_FACTOR, DRIFT_FACTOR]; contended runs are dropped, the fit is repeated,
  and the check runs again until no run is dropped (never dropping the last run). ``describe()``
  names the dropped runs.
- The host gap: time between one step's end and the next step's start (the engine's output
  processing, request submission, the recorder's flushes). It is real time in which no step runs,
  so the profile adds its mean over the clean runs (``host_gap_s``) to every step.
"""

from __future__ import annotations

import sys

import numpy as np
import pyarrow as pa

from simulator.profiles.base import EngineProfile

FEATURES = ("prefill_tokens", "decode_requests", "decode_context", "prefill_sq")
DRIFT_FACTOR = 1.5
DRIFT_SEGMENTS = 4


def _column(steps: pa.Table, name: str) -> np.ndarray:
    return steps.column(name).to_numpy(zero_copy_only=False).astype(np.float64)


def _nonnegative_lstsq(X: np.ndarray, y: np.ndarray, names: list[str]) -> tuple[np.ndarray, list[str]]:
    active = list(range(len(names)))
    while True:
        coef, *_ = np.linalg.lstsq(X[:, [0] + [i + 1 for i in active]], y, rcond=None)
        negative = [i for i, c in zip(active, coef[1:]) if c < 0]
        if not negative:
            return coef, [names[i] for i in active]
        active.remove(negative[0])


class FittedProfile(EngineProfile):
    name = "fitted"

    def __init__(self, coefficients: dict[str, float], *, source: str = "", rows: int = 0,
                 r2: float = float("nan"), host_gap_s: float = 0.0, runs_used: list | None = None,
                 runs_dropped: dict | None = None, note: str = ""):
        self.coefficients = {k: float(v) for k, v in coefficients.items()}
        self.source, self.rows, self.r2 = source, rows, r2
        self.host_gap_s = float(host_gap_s)
        self.runs_used = list(runs_used or [])
        self.runs_dropped = dict(runs_dropped or {})
        self.note = note
        self._a = self.coefficients.get("intercept", 0.0) + self.host_gap_s
        self._w = [self.coefficients.get(f, 0.0) for f in FEATURES]

    @classmethod
    def fit(cls, steps: pa.Table, source: str = "", note: str = "") -> FittedProfile:
        y = _column(steps, "step_s")
        present = [f for f in FEATURES if f in steps.column_names]
        missing = [c for c in (*FEATURES, "host_gap_s") if c not in steps.column_names]
        if missing:
            warn_reduced_model(source, missing)
        if len(y) < len(present) + 2:
            raise ValueError(f"steps table of {source or 'trace'} has {len(y)} rows: too few to fit a step-time profile")
        n = len(y)
        usable = np.ones(n, dtype=bool)
        if "rebuilt_exact" in steps.column_names:
            usable &= steps.column("rebuilt_exact").to_numpy(zero_copy_only=False).astype(bool)
        run = (steps.column("run").to_numpy(zero_copy_only=False).astype(np.int64)
               if "run" in steps.column_names else np.zeros(n, dtype=np.int64))
        X = np.column_stack([np.ones(n)] + [_column(steps, f) for f in present])
        dropped: dict[int, str] = {}
        while True:
            rows = usable & ~np.isin(run, list(dropped))
            if rows.sum() < len(present) + 2:
                raise ValueError(f"steps table of {source or 'trace'}: too few exactly known steps in clean runs to fit")
            coef, active = _nonnegative_lstsq(X[rows], y[rows], present)
            fitted = X[:, [0] + [present.index(f) + 1 for f in active]] @ coef
            worst = None
            for k in np.unique(run[rows]):
                idx = np.flatnonzero(rows & (run == k))
                for seg in np.array_split(idx, DRIFT_SEGMENTS):
                    if len(seg) < 5:
                        continue
                    ratio = float(np.median(y[seg] / np.maximum(fitted[seg], 1e-9)))
                    off = max(ratio, 1.0 / max(ratio, 1e-9))
                    if off > DRIFT_FACTOR and (worst is None or off > worst[1]):
                        worst = (int(k), off, ratio)
            if worst is None or len(np.unique(run[rows])) <= 1:
                break
            dropped[worst[0]] = (f"contended: a quarter of the run ran {worst[2]:.2f}x the fitted step time "
                                 f"(limit {DRIFT_FACTOR}x either way)")
        y_fit, f_fit = y[rows], fitted[rows]
        ss_res = float(np.sum((y_fit - f_fit) ** 2))
        ss_tot = float(np.sum((y_fit - y_fit.mean()) ** 2)) or 1.0
        host_gap = 0.0
        if "host_gap_s" in steps.column_names:
            gap = _column(steps, "host_gap_s")
            clean = ~np.isin(run, list(dropped)) & np.isfinite(gap)
            host_gap = float(np.mean(np.maximum(gap[clean], 0.0))) if clean.any() else 0.0
        coefficients = {"intercept": max(float(coef[0]), 0.0), **dict(zip(active, map(float, coef[1:])))}
        return cls(coefficients, source=source, rows=int(rows.sum()), r2=1.0 - ss_res / ss_tot,
                   host_gap_s=host_gap, runs_used=sorted(int(k) for k in np.unique(run[rows])),
                   runs_dropped=dropped, note=note)

    def compiled_coefficients(self):
        """(intercept + host gap, then the FEATURES weights): the kernel's sum in ``step_time``'s order."""
        coefs = (self._a, *self._w)
        if not all(isinstance(v, float) for v in coefs):
            return None
        return "fitted", (), coefs

    def step_time(self, prefill_tokens, prefill_sq, decode_batch, decode_context) -> float:
        w = self._w
        t = self._a + w[0] * prefill_tokens + w[1] * decode_batch + w[2] * decode_context + w[3] * prefill_sq
        return t if t > 1e-9 else 1e-9

    def describe(self) -> dict:
        out = {"name": self.name, "coefficients": self.coefficients, "source": self.source,
               "rows": self.rows, "r2": self.r2, "host_gap_s": self.host_gap_s,
               "runs_used": self.runs_used, "runs_dropped": {str(k): v for k, v in self.runs_dropped.items()}}
        if self.note:
            out["note"] = self.note
        return out


_WARNED: set[tuple[str, tuple[str, ...]]] = set()


def warn_reduced_model(source: str, missing: list[str]) -> None:
    """One stderr line (once per source) when a steps table lacks columns of the full model: the fit
    then leaves those terms out, which the user must hear about, not find in a worse replay."""
    key = (source, tuple(missing))
    if key in _WARNED:
        return
    _WARNED.add(key)
    print(f"warning: steps table {source or 'trace'}.steps.parquet has no {', '.join(missing)}: the step-time "
          "profile fits a reduced model without them (add them with scripts/rebuild_steps.py --replace)",
          file=sys.stderr, flush=True)
