"""least-work: the replica with the fewest predicted outstanding output tokens (docs/semantics.md
"Fleets": the routing estimate until the replica's own estimate exists); ties to the lowest index."""

from __future__ import annotations

from routers import rules
from routers.base import FleetView, Router, lowest


class LeastWork(Router):
    name = "least-work"
    reads = "predicted_work"
    compiled_rule = staticmethod(rules.least_work)

    def choose(self, row: int, view: FleetView) -> int:
        assert view.work is not None
        return lowest(view.work)
