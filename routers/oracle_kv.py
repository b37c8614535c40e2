"""oracle-kv (decode router): least-predicted-kv with the true output lengths in place of the
estimates (its upper bound; it reads the true lengths); ties to the lowest index."""

from __future__ import annotations

from routers.base import FleetView, Router, lowest


class OracleKV(Router):
    name = "oracle-kv"
    reads = "true_kv"
    stages = ("decode",)

    def choose(self, row: int, view: FleetView) -> int:
        assert view.kv_true is not None
        return lowest(view.kv_true)
