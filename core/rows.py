"""Row checks shared by every reader of tabular input (traces, their side tables, imported public
traces, arrival CSVs), one per kind of bad value, each naming the file, the column and the first
bad row, so that the same mistake reads the same way whichever file it is in."""

from __future__ import annotations

import numpy as np

from core.contract import TraceError


def first_row(mask: np.ndarray) -> int:
    """Index of the first True of a boolean array (the row a message names)."""
    return int(np.flatnonzero(mask)[0])


def check_times(where: str, column: str, values: np.ndarray, *, error: type[Exception] = TraceError) -> None:
    """Times are finite and not negative: a negative time is a corrupt or misread value (a time
    origin after the requests), never a moment before the trace started. ``where`` names the
    file (``trace PATH``, ``--arrivals PATH``); rows count from 0."""
    values = np.asarray(values, dtype=np.float64)
    bad = ~np.isfinite(values) | (values < 0)
    if bad.any():
        row = first_row(bad)
        raise error(f"{where}: column {column}: row {row}: {values[row]} is not a finite, non-negative time")


def check_vectors(where: str, column: str, matrix: np.ndarray, width: int | None = None,
                  rows: str = "row") -> None:
    """Hidden-state or embedding vectors: the width the trace declares (``hidden_size``) and no
    NaN or infinity, which a linear read-out would turn into NaN estimates without a word."""
    if width is not None and matrix.shape[1] != width:
        raise TraceError(f"{where}: column {column}: vector length {matrix.shape[1]} differs from "
                         f"declared hidden_size {width}")
    finite = np.isfinite(matrix).all(axis=1)
    if not finite.all():
        raise TraceError(f"{where}: column {column}: {rows} {first_row(~finite)}: non-finite value in vector")
