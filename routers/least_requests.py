"""least-requests: the replica with the fewest outstanding (waiting + running) requests, read exactly,
ties to the lowest index. vLLM 0.32's data-parallel balancer starts from the same count but also
weighs waiting requests by KV use, reads 100 ms snapshots and rotates ties (docs/semantics.md
"Where this differs from stock vLLM")."""

from __future__ import annotations

from routers import rules
from routers.base import FleetView, Router, lowest


class LeastRequests(Router):
    name = "least-requests"
    reads = "outstanding"
    compiled_rule = staticmethod(rules.least_requests)

    def choose(self, row: int, view: FleetView) -> int:
        assert view.outstanding is not None
        return lowest(view.outstanding)
