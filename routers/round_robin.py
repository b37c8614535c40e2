"""round-robin: request k (arrival order) goes to replica k mod N, whatever the replicas hold."""

from __future__ import annotations

from routers import rules
from routers.base import FleetView, Router


class RoundRobin(Router):
    name = "round-robin"
    reads = "nothing"
    compiled_rule = staticmethod(rules.round_robin)

    def reset(self, replicas: int, seed: int) -> None:
        super().reset(replicas, seed)
        self.routed = 0

    def choose(self, row: int, view: FleetView) -> int:
        replica = self.routed % self.replicas
        self.routed += 1
        return replica
