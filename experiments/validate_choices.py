"""What ``leap-validate`` lets the user choose for serving runs, checked before any replay: the FCFS
run a policy's gain is measured against (``--reference RUN``; otherwise the one it picks is named),
and source traces given by path (``--source PATH``), accepted only with the content hash the run
was served from."""

from __future__ import annotations

import sys

from core.trace import Trace
from experiments.serving_runs import fcfs_partner, is_fcfs_run
from simulator.serving import GIVEN_SOURCES, is_serving
from simulator.serving import serving_meta as _serving


def check_reference(reference: Trace, serving: list[Trace]) -> None:
    """``--reference RUN`` must be an FCFS serving run of the same workload and load as every
    non-FCFS run being validated."""
    if not is_serving(reference) or not is_fcfs_run(reference):
        raise ValueError(f"--reference {reference.name}: not an FCFS serving run (policy fcfs, predictor none)")
    for run in serving:
        if not is_fcfs_run(run) and fcfs_partner(run, [], reference) is not reference:
            raise ValueError(f"--reference {reference.name}: not a run of the same workload and load as {run.name}")


def register_sources(sources: list[Trace], serving: list[Trace]) -> None:
    """Source traces given by path: each must be the source of some run, with the recorded hash."""
    for source in sources:
        recorded = [(_serving(run).get("source_trace") or {}) for run in serving]
        if not any(r.get("sha256") == source.content_hash for r in recorded):
            named = next((r for r in recorded if r.get("name") == source.name), None)
            if named is not None:
                raise ValueError(f"--source {source.path or source.name}: content hash {source.content_hash[:12]}, "
                                 f"the runs were served from {str(named.get('sha256'))[:12]}: not the same requests")
            raise ValueError(f"--source {source.path or source.name}: no run given was served from it")
        GIVEN_SOURCES[source.content_hash] = source


def name_references(rows: list[dict], prog: str) -> None:
    """One stderr line per non-FCFS run: the FCFS run its gain was measured against."""
    for row in rows:
        if row.get("policy") != "fcfs" and "fcfs_run" in row:
            chosen = row["fcfs_run"] or "none found (no FCFS run of the same workload and load)"
            print(f"{prog}: note: {row['run']}: FCFS reference {chosen} (--reference RUN picks another)",
                  file=sys.stderr, flush=True)
