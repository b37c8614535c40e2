"""Calibration files (``leap-serve calibrate``): a designed grid of engine steps, and the profile
fitted on it (``--engine fitted:BASE.calibration.json``).

A calibration is a pair written by ``live/calibrate.py``: ``BASE.calibration.parquet`` (one row
per engine step: the ``fitted`` profile's columns, ``host_gap_s``, the grid ``cell`` and
``cell_step``) and ``BASE.calibration.json`` (kind ``calibration`` or ``check``, engine settings,
probes, the steps file's SHA-256). Kept apart from serving traces (``traces/live/calibration/``)
so that a folder of runs never mistakes one for a trace.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from simulator.profiles.fitted import FEATURES, FittedProfile, _nonnegative_lstsq

CALIBRATION_SUFFIX = ".calibration"


def is_calibration_path(path: str | Path) -> bool:
    return str(path).endswith((CALIBRATION_SUFFIX + ".json", CALIBRATION_SUFFIX + ".parquet"))


def calibration_paths(base: str | Path) -> tuple[Path, Path]:
    """(steps, metadata) paths of a calibration given as its base name or either of its files."""
    text = str(base)
    for ending in (".json", ".parquet"):
        if text.endswith(CALIBRATION_SUFFIX + ending):
            text = text[: -len(ending)]
            break
    else:
        text += CALIBRATION_SUFFIX
    return Path(text + ".parquet"), Path(text + ".json")


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
    """Read a calibration pair, checking the steps file against the hash its metadata names."""
    import pyarrow.parquet as pq

    steps_path, meta_path = calibration_paths(path)
    if not meta_path.is_file():
        raise ValueError(f"calibration metadata not found: {meta_path}")
    if not steps_path.is_file():
        raise ValueError(f"calibration steps not found: {steps_path}")
    try:
        meta = json.loads(meta_path.read_text())
    except ValueError:
        raise ValueError(f"{meta_path}: not a JSON calibration file") from None
    if not isinstance(meta, dict) or meta.get("kind") not in ("calibration", "check"):
        raise ValueError(f"{meta_path}: not a calibration (kind must be 'calibration' or 'check')")
    digest = hashlib.sha256(steps_path.read_bytes()).hexdigest()
    if meta.get("steps_sha256") != digest:
        raise ValueError(f"{steps_path}: content hash differs from the one {meta_path.name} names")
    steps = pq.read_table(steps_path)
    missing = [c for c in ("step_s", "prefill_tokens", "decode_requests", "decode_context", "prefill_sq",
                           "host_gap_s", "cell", "cell_step") if c not in steps.column_names]
    if missing:
        raise ValueError(f"{steps_path}: column {missing[0]!r} missing")
    name = meta_path.name[: -len(CALIBRATION_SUFFIX + ".json")]
    return Calibration(name, meta_path, steps, meta)


SHAPE = ("prefill_tokens", "decode_requests", "decode_context")


def speed_vs_calibration(check: pa.Table, calibration: pa.Table) -> dict:
    """How fast a check ran against its calibration: over the check's steps whose (cell,
    cell_step) and composition match a calibration step, the median (and p10, p90) of check
    step time / calibration step time. No model in between: same shapes, same engine."""
    def keyed(t: pa.Table) -> dict:
        cols = [t.column(c).to_pylist() for c in ("cell", "cell_step", *SHAPE, "step_s")]
        return {tuple(row[:5]): row[5] for row in zip(*cols)}

    ref, got = keyed(calibration), keyed(check)
    ratios = np.array([got[k] / ref[k] for k in got if k in ref and ref[k] > 0])
    if not len(ratios):
        raise ValueError("the check shares no step (cell, step, composition) with its calibration")
    return {"median": float(np.median(ratios)), "p10": float(np.percentile(ratios, 10)),
            "p90": float(np.percentile(ratios, 90)), "matched_steps": int(len(ratios)),
            "check_steps": int(check.num_rows)}


def write_calibration(steps_path: Path, meta_path: Path, table: pa.Table, meta: dict) -> None:
    """Steps first, then the metadata naming the steps' hash (a reader trusts the pair by it)."""
    from core.io import atomic_write_json, atomic_write_parquet

    steps_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_parquet(steps_path, table, compression="zstd")
    meta["steps_sha256"] = hashlib.sha256(steps_path.read_bytes()).hexdigest()
    atomic_write_json(meta_path, meta)
