"""A P/D fleet's :class:`RunResult`: each request's life gathered from its prefill and its decode
instance (docs/semantics.md "Prefill/decode disaggregation")."""

from __future__ import annotations

from typing import Any

import numpy as np

from simulator.engine import RunResult

#: a :class:`simulator.pd_fleet.PDFleet` (not imported: it imports this module)
PDFleet = Any


def _gather(instances, names: tuple[str, ...], n: int, kind) -> dict[str, np.ndarray]:
    out = {name: np.full(n, np.nan) if kind is float else np.full(n, -1, dtype=np.int64) for name in names}
    for replica in instances:
        t, k = replica.parts.table, replica.routed
        rows = replica.rows[:k]
        for name, arr in out.items():
            arr[rows] = getattr(t, name)[:k]
    return out


def pd_result(fleet: PDFleet, sim_cpu_s: float) -> RunResult:
    n = fleet.n
    # the prefill instance: admission, the prefill's end, the estimate; the decode instance: the rest
    pre = _gather(fleet.fleet, ("admit_s", "first_token_s", "first_predicted", "ready_s"), n, float)
    pre_steps = _gather(fleet.fleet, ("admit_step",), n, int)
    dec = _gather(fleet.decoders, ("first_token_s", "finish_s"), n, float)
    dec_steps = _gather(fleet.decoders, ("first_token_step", "finish_step", "forced_steps"), n, int)
    preemptions = None
    if fleet.config.kv_bounded:
        preemptions = np.zeros(n, dtype=np.int64)
        for decoder in fleet.decoders:
            preemptions[decoder.rows[:decoder.routed]] = decoder.parts.table.preemptions[:decoder.routed]
    instances = fleet.fleet + fleet.decoders
    drivers = [r.driver for r in instances]
    decodes = sum(getattr(r.driver, "in_use_decodes", 0) for r in fleet.decoders)
    error = sum(getattr(r.driver, "in_use_abs_error", 0.0) for r in fleet.decoders)
    stages = {"prefill_replica": fleet.assigned.copy(), "decode_replica": fleet.decode_of.copy(),
              "prefill_done_s": pre["first_token_s"], "transfer_start_s": fleet.transfer[:, 1].copy(),
              "transfer_end_s": fleet.transfer[:, 2].copy(), "decode_placed_s": fleet.transfer[:, 0].copy()}
    return RunResult(
        workload=fleet.workload, rows_request_id=fleet.workload.request_id, arrival_s=fleet.arrival,
        admit_s=pre["admit_s"], first_token_s=dec["first_token_s"], finish_s=dec["finish_s"],
        admit_step=pre_steps["admit_step"], first_token_step=dec_steps["first_token_step"],
        finish_step=dec_steps["finish_step"], prompt_tokens=fleet.prompt, output_tokens=fleet.length,
        predicted_tokens=pre["first_predicted"], predicted_ready_s=pre["ready_s"],
        forced_steps=dec_steps["forced_steps"], steps=sum(r.step for r in instances),
        gpu_s_charged=sum(d.gpu_s for d in drivers), predictor_cpu_s=sum(d.cpu_s for d in drivers),
        updates_published=sum(d.updates for d in drivers), sim_cpu_s=sim_cpu_s,
        output_kind=fleet.decoders[0].driver.output_kind, mae_in_use=error / decodes if decodes else None,
        contended_steps=sum(r.parts.scheduler.contended for r in instances), preemptions=preemptions,
        balance_max_over_mean=fleet.decode_balance.max_over_mean, stages=stages,
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
