"""LEAP's cost model: deterministic constants, so runs replay exactly.

Cost figures (deterministic model constants, measured by ``benchmarks/bench_leap.py`` on the
development machine: 2-core shared AMD EPYC VM, numpy 2.4 with OpenBLAS 0.3.31, one thread):
see :func:`prediction_cpu_s` (3.0 us at d = 576, 8.4 us at d = 4096) and :func:`rls_update_cpu_s`
(0.5 ms per update of 8 at d = 576, 16 ms at d = 4096).
"""

from __future__ import annotations

import numpy as np

# --- cost model (benchmarks/bench_leap.py, one BLAS thread, on the development machine: a shared
# 2-vCPU AMD EPYC VM, numpy 2.4.6 with OpenBLAS 0.3.31, measured under a load average of 5-7, so the
# figures are thread CPU time, not wall time) ------------------------------------------------------
#: CPU seconds from the fp16 feature vector landing in host memory to a ready estimate
#: (``LinearReadout.predict_one``: fp16 -> fp32, folded dot product, clip, square), modelled as
#: PREDICT_FIXED_S + PREDICT_S_PER_DIM * d from the median single-request latencies: 8.4 us at
#: d = 4096, 3.0 us at d = 576. (With an fp32 feature it is 2.1 us at d = 4096.)
PREDICT_FIXED_S = 2.1e-6
PREDICT_S_PER_DIM = 1.55e-9
#: RLS update time model t(b, p) = RLS_FIXED_S + RLS_S_PER_BD2 * b * p^2 (p = d + 1 counts the bias),
#: from the mean CPU time per update of 8 over whole read-only/fold cycles: 16 ms at p = 4097
#: (read-only updates ~11 ms, every 4th folds the pending rank-32 downdate, ~30 ms); 0.5 ms at p = 577.
RLS_FIXED_S = 2e-4
RLS_S_PER_BD2 = 1.18e-10


def prediction_cpu_s(dim: int) -> float:
    """Modelled CPU seconds of one prediction from a ``dim``-wide feature vector."""
    return PREDICT_FIXED_S + PREDICT_S_PER_DIM * dim


def rls_update_cpu_s(batch: int, dim: int) -> float:
    """Modelled CPU seconds of one RLS update of ``batch`` rows with ``dim`` parameters."""
    return RLS_FIXED_S + RLS_S_PER_BD2 * batch * dim * dim


# Decode-time refresh (the paper's Table 2 ablation). Re-reading the tapped layer during decode
# means copying one request's state to the CPU at a step boundary, which breaks the asynchronous
# pipeline: charged as a small GPU stall per refreshed request (an estimate: ~10 us for the D2H
# copy of one 8 KB vector plus ~10 us of synchronisation; no GPU was available to measure it).
REFRESH_GPU_S = 20e-6


def tap_fraction(metadata: dict, column: str) -> float:
    """Share of a prefill step done when the tapped layer is reached: (layer + 1) / layers, else 1."""
    layer = (metadata.get("layers") or {}).get(column)
    num_layers = metadata.get("num_layers")
    if (isinstance(layer, (int, np.integer)) and isinstance(num_layers, (int, np.integer))
            and not isinstance(layer, bool) and 0 <= layer < num_layers):
        return (int(layer) + 1) / int(num_layers)
    return 1.0
