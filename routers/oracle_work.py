"""oracle-work: the replica with the fewest true outstanding output tokens (an upper bound for
least-work: it reads the true lengths); ties to the lowest index."""

from __future__ import annotations

from routers import rules
from routers.base import FleetView, Router, lowest


class OracleWork(Router):
    name = "oracle-work"
    reads = "true_work"
    compiled_rule = staticmethod(rules.oracle_work)

    def choose(self, row: int, view: FleetView) -> int:
        assert view.true_work is not None
        return lowest(view.true_work)
