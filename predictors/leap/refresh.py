"""Decode-time refresh (the paper's Table 2 ablation): re-estimate from states recorded during decode.

A second read-out, trained like the prefill one on the training trace's decode side table, maps a
decode-time state to sqrt(remaining tokens); a refresh looks up the latest recorded state of each
request at or before its generated count.
"""

from __future__ import annotations

import numpy as np

from core.readout import DEFAULT_COLUMN, DEFAULT_TARGET, LinearReadout, fit_readout
from core.trace import Trace, TraceError, trace_from_arrays


def fit_decode_readout(train: Trace, layer: int, *, use_cache: bool = True) -> LinearReadout:
    """Ridge read-out of sqrt(remaining tokens) from decode-time states of ``layer`` in ``train``'s
    decode side table: the refresh model, trained like the prefill one (same CV, clip, square)."""
    rows, generated, vectors = train.decode_vectors(layer)
    remaining = train.output_tokens[rows] - generated
    keep = remaining >= 1
    if keep.sum() < 10:
        raise TraceError(f"trace {train.name}: too few decode states at layer {layer} to train a refresh "
                         f"read-out ({int(keep.sum())})")
    samples = trace_from_arrays(f"{train.name}-decode-L{layer}", np.ones(int(keep.sum()), dtype=np.int32),
                                remaining[keep], max_tokens=train.output_cap,
                                features={DEFAULT_COLUMN: vectors[keep]},
                                metadata={"layers": {DEFAULT_COLUMN: int(layer)}})
    readout, _ = fit_readout(samples, DEFAULT_COLUMN, DEFAULT_TARGET, use_cache=use_cache)
    return readout


class DecodeEstimates:
    """Total-length estimates from every recorded decode state of one bound workload."""

    def __init__(self, decoder: LinearReadout, workload: Trace, layer: int):
        rows, generated, vectors = workload.decode_vectors(layer)
        if len(rows) == 0:
            raise TraceError(f"trace {workload.name!r}: its decode side table has no states at layer {layer}")
        self.decoder = decoder
        self._gen = generated
        self._total = generated + decoder.output(decoder.linear(decoder.standardize(vectors, dtype=np.float32)))
        n = len(workload)
        self._start = np.searchsorted(rows, np.arange(n), side="left")
        self._end = np.searchsorted(rows, np.arange(n), side="right")

    def refresh(self, current: np.ndarray, rows: np.ndarray, generated) -> np.ndarray:
        """Total length = tokens generated when the latest recorded state was taken + its estimate
        of the remaining tokens; rows without a newer state keep ``current``."""
        out = current.copy()
        for i, (row, g) in enumerate(zip(rows.tolist(), np.asarray(generated).tolist())):
            a, b = self._start[row], self._end[row]
            j = a + int(np.searchsorted(self._gen[a:b], g, side="right")) - 1
            if j >= a:
                out[i] = max(self._total[j], g + 1.0)
        return out
