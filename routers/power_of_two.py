"""power-of-two: two distinct replicas drawn at random (the run's seed), the one with fewer
outstanding requests; on a tie the lower index. One replica: always it, nothing drawn."""

from __future__ import annotations

import numpy as np

from routers import rules
from routers.base import FleetView, Router

#: Second word of the router's seed, so its draws are not the arrival process's (seeded by the seed alone).
STREAM = 2


class PowerOfTwo(Router):
    name = "power-of-two"
    reads = "outstanding"
    compiled_rule = staticmethod(rules.power_of_two)

    def reset(self, replicas: int, seed: int) -> None:
        super().reset(replicas, seed)
        self.rng = np.random.default_rng([seed, STREAM])

    def choose(self, row: int, view: FleetView) -> int:
        assert view.outstanding is not None
        if self.replicas == 1:
            return 0
        a, b = sorted(int(x) for x in self.rng.choice(self.replicas, size=2, replace=False))
        return b if view.outstanding[b] < view.outstanding[a] else a

    def compiled_draws(self, requests: int) -> np.ndarray:
        """Three words a routing (two bounded draws and the pair's shuffle), with room for Lemire's
        rare rejections (each under replicas / 2**32); none with one replica."""
        if self.replicas == 1:
            return np.zeros(0, dtype=np.uint32)
        return rules.words(self.rng, 3 * requests + 1024 + requests // 1000)
