"""Request attributes, declared once: each one's name, dtype, default and source column in a trace.

A policy's rule (``policies/rule.py``), the simulator's request table and kernel, routers and the
live scheduler all read a request's attributes from one :data:`Attributes` tuple of arrays built
here, so a new attribute is one line in :data:`ATTRIBUTES`: the trace column it is read from (a
trace without the column gives every request the default), and the arrays follow it everywhere.
``Attributes`` is a named tuple (``attrs.priority[row]``), which numba compiles as it is.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Attribute:
    """One request attribute: ``column`` is the trace column it is read from."""

    name: str
    dtype: type
    default: int | float
    column: str
    meaning: str
    live_field: str | None = None   # the vLLM ``Request`` attribute a live request carries it in


ATTRIBUTES: tuple[Attribute, ...] = (
    Attribute("priority", np.int64, 0, "priority",
              "priority class, lower first (vLLM's Request.priority; 0 when the trace has no column)",
              live_field="priority"),
)

#: the attributes' arrays, one per declared attribute, indexed by row
Attributes = namedtuple("Attributes", [a.name for a in ATTRIBUTES])  # type: ignore[misc]


def defaults(n: int) -> Attributes:
    """Every attribute at its default for ``n`` requests."""
    return Attributes(*(np.full(n, a.default, dtype=a.dtype) for a in ATTRIBUTES))


def from_columns(columns: Mapping[str, Sequence | np.ndarray], n: int, source: str) -> Attributes:
    """The attributes of ``n`` requests from a table's ``columns`` (a column absent: the default;
    a missing value: the default). ``source`` names the table in the one-line error for a column
    whose values are not of the attribute's kind."""
    arrays: list[np.ndarray] = []
    for a in ATTRIBUTES:
        if a.column not in columns:
            arrays.append(np.full(n, a.default, dtype=a.dtype))
            continue
        values = [a.default if v is None else v for v in columns[a.column]]
        try:
            array = np.asarray(values, dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"{source}: column {a.column!r} must hold numbers ({a.meaning})") from None
        exact: np.ndarray = array.astype(a.dtype)
        if not np.array_equal(exact.astype(np.float64), array, equal_nan=False):
            raise ValueError(f"{source}: column {a.column!r} holds values that are not {np.dtype(a.dtype).name} "
                             f"({a.meaning})")
        arrays.append(exact)
    return Attributes(*arrays)


def of_trace(trace) -> Attributes:
    """The attributes of a :class:`core.trace.Trace`'s requests, in its row order."""
    table = trace.table
    names = set(table.column_names)
    columns = {a.column: table.column(a.column).to_pylist() for a in ATTRIBUTES if a.column in names}
    return from_columns(columns, len(trace), f"trace {trace.name}")


def live_fields(trace, rows: Sequence[int] | np.ndarray) -> list[dict]:
    """Per row of ``rows``, the vLLM request fields that carry the trace's attributes to a live engine
    (``{live_field: value}``; only attributes whose column the trace has, so a trace without them
    sends what it always sent)."""
    names = set(trace.table.column_names)
    carried = [a for a in ATTRIBUTES if a.live_field and a.column in names]
    if not carried:
        return [{} for _ in rows]
    attrs = of_trace(trace)
    return [{a.live_field: getattr(attrs, a.name)[int(i)].item() for a in carried} for i in rows]


def of_requests(requests: Sequence) -> Attributes:
    """The attributes of live requests (vLLM ``Request`` objects), each from its ``live_field`` where
    the request has one, else the default."""
    n = len(requests)
    return Attributes(*(np.fromiter((getattr(r, a.live_field, a.default) if a.live_field else a.default
                                     for r in requests), dtype=a.dtype, count=n) for a in ATTRIBUTES))
