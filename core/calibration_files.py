"""Calibration files (``leap-serve calibrate``): how a calibration or a host-speed check is
written and read, and the speed of a check against its calibration. The profile fitted on a
calibration is the simulator's (``simulator.profiles.calibration``); the live side writes and
checks calibrations without it.

A calibration is a pair: ``BASE.calibration.parquet`` (one row per engine step: the ``fitted``
profile's columns, ``host_gap_s``, the grid ``cell`` and ``cell_step``) and
``BASE.calibration.json`` (kind ``calibration`` or ``check``, engine settings, probes, the steps
file's SHA-256). Kept apart from serving traces (``traces/live/calibration/``) so that a folder of
runs never mistakes one for a trace.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa

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


#: Columns a calibration's steps table must have.
STEP_COLUMNS = ("step_s", "prefill_tokens", "decode_requests", "decode_context", "prefill_sq",
                "host_gap_s", "cell", "cell_step")


def read_calibration(path: str | Path) -> tuple[str, Path, pa.Table, dict]:
    """(name, metadata path, steps, metadata) of a calibration pair, the steps file checked
    against the hash its metadata names."""
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
    missing = [c for c in STEP_COLUMNS if c not in steps.column_names]
    if missing:
        raise ValueError(f"{steps_path}: column {missing[0]!r} missing")
    return meta_path.name[: -len(CALIBRATION_SUFFIX + ".json")], meta_path, steps, meta


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
