"""A fleet's :class:`RunResult`, written once for a fleet of replicas (``simulator.fleet``: each
request admitted, decoded and finished on one replica) and a prefill/decode fleet
(``simulator.pd_result``: admitted and prefilled on a prefill instance, decoded and finished on a
decode instance): each request's life gathered by workload row from the instances that held it."""

from __future__ import annotations

from typing import Any

import numpy as np

from simulator.engine import RunResult

#: what the admitting instance knows of a request: its admission, its estimate and when it was ready
FRONT_TIMES, FRONT_STEPS = ("admit_s", "first_predicted", "ready_s"), ("admit_step",)
#: what the finishing instance knows: its first token (a P/D decode instance's: its first decode), its end
BACK_TIMES, BACK_STEPS = ("first_token_s", "finish_s"), ("first_token_step", "finish_step", "forced_steps")


def gather(instances, names: tuple[str, ...], n: int, kind) -> dict[str, np.ndarray]:
    """Each ``names`` column of the instances' tables, by workload row (NaN, or -1 for ``int``, where
    no instance held the row)."""
    out = {name: np.full(n, np.nan) if kind is float else np.full(n, -1, dtype=np.int64) for name in names}
    for replica in instances:
        t, k = replica.parts.table, replica.routed
        rows = replica.rows[:k]
        for name, arr in out.items():
            arr[rows] = getattr(t, name)[:k]
    return out


def fleet_result(owner: Any, front: list, back: list, sim_cpu_s: float, **extra) -> RunResult:
    """The run of ``owner`` (a fleet: its ``n``, ``workload``, ``arrival``, ``prompt``, ``length``,
    ``config``): admissions and estimates from the ``front`` instances, first tokens, finishes, forced
    steps, preemptions and the in-use MAE from the ``back`` ones (the same list for a fleet of
    replicas); steps, costs and contention summed over all of them. ``extra``: the RunResult fields of
    the fleet's kind (its replicas, balance, stages...)."""
    n = owner.n
    times = {**gather(front, FRONT_TIMES, n, float), **gather(back, BACK_TIMES, n, float)}
    steps = {**gather(front, FRONT_STEPS, n, int), **gather(back, BACK_STEPS, n, int)}
    preemptions = None
    if owner.config.kv_bounded:   # per request, times preempted (as one engine reports them)
        preemptions = np.zeros(n, dtype=np.int64)
        for replica in back:
            preemptions[replica.rows[:replica.routed]] = replica.parts.table.preemptions[:replica.routed]
    instances = front if front is back else front + back
    drivers = [r.driver for r in instances]
    decodes = sum(getattr(r.driver, "in_use_decodes", 0) for r in back)
    error = sum(getattr(r.driver, "in_use_abs_error", 0.0) for r in back)
    return RunResult(
        workload=owner.workload, rows_request_id=owner.workload.request_id, arrival_s=owner.arrival,
        admit_s=times["admit_s"], first_token_s=times["first_token_s"], finish_s=times["finish_s"],
        admit_step=steps["admit_step"], first_token_step=steps["first_token_step"],
        finish_step=steps["finish_step"], prompt_tokens=owner.prompt, output_tokens=owner.length,
        predicted_tokens=times["first_predicted"], predicted_ready_s=times["ready_s"],
        forced_steps=steps["forced_steps"], steps=sum(r.step for r in instances),
        gpu_s_charged=sum(d.gpu_s for d in drivers), predictor_cpu_s=sum(d.cpu_s for d in drivers),
        updates_published=sum(d.updates for d in drivers), sim_cpu_s=sim_cpu_s,
        output_kind=back[0].driver.output_kind, mae_in_use=error / decodes if decodes else None,
        contended_steps=sum(r.parts.scheduler.contended for r in instances), preemptions=preemptions, **extra)
