"""A P/D fleet's :class:`RunResult`: each request's life gathered from its prefill and its decode
instance (docs/semantics.md "Prefill/decode disaggregation")."""

from __future__ import annotations

from typing import Any

import numpy as np

from simulator.engine import RunResult
from simulator.fleet_result import fleet_result, gather

#: a :class:`simulator.pd_fleet.PDFleet` (not imported: it imports this module)
PDFleet = Any


def pd_result(fleet: PDFleet, sim_cpu_s: float) -> RunResult:
    """Admission and the estimate from the prefill instance, the rest from the decode instance
    (:func:`simulator.fleet_result.fleet_result`), and each request's stages."""
    prefill_done = gather(fleet.fleet, ("first_token_s",), fleet.n, float)["first_token_s"]
    stages = {"prefill_replica": fleet.assigned.copy(), "decode_replica": fleet.decode_of.copy(),
              "prefill_done_s": prefill_done, "transfer_start_s": fleet.transfer[:, 1].copy(),
              "transfer_end_s": fleet.transfer[:, 2].copy(), "decode_placed_s": fleet.transfer[:, 0].copy()}
    return fleet_result(fleet, fleet.fleet, fleet.decoders, sim_cpu_s, stages=stages,
                        balance_max_over_mean=fleet.decode_balance.max_over_mean,
                        pd_replicas=(fleet.replicas, fleet.decode_replicas))


def pd_summary(result: RunResult) -> dict:
    """A P/D fleet's summary figures: its instances, the balance of its decode instances (requests
    and, at each decode placement, outstanding true work: max / mean), the KV transfers (mean ms)
    and the wait for decode blocks before a transfer starts (mean ms)."""
    assert result.stages is not None and result.pd_replicas is not None
    stages = result.stages
    counts = np.bincount(stages["decode_replica"], minlength=result.pd_replicas[1]).astype(np.float64)
    transfer = stages["transfer_end_s"] - stages["transfer_start_s"]
    wait = stages["transfer_start_s"] - stages["decode_placed_s"]
    return {
        "prefill_replicas": int(result.pd_replicas[0]),
        "decode_replicas": int(result.pd_replicas[1]),
        "decode_requests_max_over_mean": float(counts.max() / counts.mean()) if counts.mean() > 0 else None,
        "decode_work_max_over_mean": result.balance_max_over_mean,
        "mean_kv_transfer_ms": float(transfer.mean() * 1e3) if len(transfer) else None,
        "mean_kv_block_wait_ms": float(wait.mean() * 1e3) if len(wait) else None,
    }
