"""Per-run metrics added to the summary, each written once: a function of the run and its requests'
latencies, registered in :data:`RUN_METRICS` under its summary key.

One entry here is all a new metric takes (docs/extending.md "Add a metric"): :func:`simulator.metrics.summarize`
writes it into every run's summary (``--json``, ``summary.json``, ``results.csv``/``results.parquet`` of
a sweep), and ``simulate --wide`` shows it as a column with its legend. ``lat`` is
:func:`core.latency.request_latencies` of the run (seconds, completed requests only: ``ttft``,
``e2el``, ``tpot`` (requests of more than one token), ``tpot_all``, ``nl``, ``tokens``, ``done``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:   # the table imports this module without loading the engine
    from simulator.engine import RunResult


@dataclass(frozen=True)
class RunMetric:
    """``header``: its column in ``simulate --wide``; ``legend``: the legend's entry for it;
    ``compute(result, lat)``: the figure (a float, or None where the run has none)."""

    header: str
    legend: str
    compute: Callable[[RunResult, dict[str, np.ndarray]], float | None]


def p99_nl(result: RunResult, lat: dict[str, np.ndarray]) -> float | None:
    """The 99th percentile of normalized latency (e2e / output tokens), in seconds."""
    return float(np.percentile(lat["nl"], 99)) if len(lat["nl"]) else None


#: summary key -> metric, in the order the summary and the wide table list them
RUN_METRICS: dict[str, RunMetric] = {
    "p99_ptl_s": RunMetric("p99 NL", "p99 NL: 99th percentile of normalized latency", p99_nl),
}


def run_metrics(result: RunResult, lat: dict[str, np.ndarray]) -> dict[str, float | None]:
    """Every registered metric of one run, by summary key (NaN and inf become null, as JSON needs)."""
    out: dict[str, float | None] = {}
    for key, metric in RUN_METRICS.items():
        value = metric.compute(result, lat)
        out[key] = None if value is None or not math.isfinite(value) else float(value)
    return out


def wide_columns() -> list[tuple[str, str]]:
    """The registered metrics' columns of ``simulate --wide``: (header, summary key)."""
    return [(metric.header, key) for key, metric in RUN_METRICS.items()]


def wide_legend() -> str:
    """The registered metrics' legend entries, each after a `` | ``."""
    return "".join(f" | {metric.legend}" for metric in RUN_METRICS.values())
