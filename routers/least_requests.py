"""least-requests: the replica with the fewest outstanding (waiting + running) requests, as vLLM's
data-parallel balancer and production-stack route; ties to the lowest index."""

from __future__ import annotations

from routers.base import FleetView, Router, lowest


class LeastRequests(Router):
    name = "least-requests"
    reads = "outstanding"

    def choose(self, row: int, view: FleetView) -> int:
        assert view.outstanding is not None
        return lowest(view.outstanding)
