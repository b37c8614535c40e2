"""The error figures of a replay against its measured run, written once for both validators
(``leap-validate`` on recorded traces, ``experiments.validate``; and on serving runs,
``experiments.validate_serving``): each figure is the simulated one over the measured one, minus 1
(positive: the simulator is slower), and the median over requests of |simulated - measured| /
measured end-to-end latency (the same request compared with itself)."""

from __future__ import annotations

import numpy as np

#: figure -> the summary figure it compares (``real_``/``sim_`` + name)
RELATIVE_ERRORS = {"p95_e2e_err": "p95_e2e_s", "mean_e2e_err": "mean_e2e_s", "mean_ptl_err": "mean_ptl_s",
                   "makespan_err": "makespan_s"}


def replay_errors(row: dict, sim_e2e: np.ndarray, real_e2e: np.ndarray) -> dict:
    """Error figures from a row holding ``real_*``/``sim_*`` figures and the per-request e2e latencies
    (same request order); figures missing from ``row`` are left out."""
    out = {name: row[f"sim_{figure}"] / row[f"real_{figure}"] - 1.0 for name, figure in RELATIVE_ERRORS.items()
           if f"sim_{figure}" in row and f"real_{figure}" in row}
    real_e2e = np.asarray(real_e2e, dtype=np.float64)
    out["median_abs_e2e_err"] = float(np.median(np.abs(np.asarray(sim_e2e, dtype=np.float64) - real_e2e) / real_e2e))
    return out
