"""Per-request metrics of a run and its one-line summary (the JSON object ``--json`` prints)."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

from core.latency import itl_from_request_means, latency_summary, request_goodput, request_latencies, slo_attainment
from simulator.engine import RunResult
from simulator.run_metrics import run_metrics

LONG_REQUEST_TOKENS = 1024

REQUEST_COLUMNS = ("request_id", "arrival_s", "admit_s", "first_token_s", "finish_s", "admit_step",
                   "first_token_step", "finish_step", "output_tokens", "prompt_tokens", "predicted_tokens",
                   "forced_steps")

#: Summary fields measured on this machine rather than simulated: shown on the console, never
#: written to result files, so that the same seed writes the same bytes.
MEASURED_FIELDS = ("sim_cpu_s",)


def simulated_only(summary: dict) -> dict:
    """The summary without its machine-measured fields (what result files hold)."""
    return {k: v for k, v in summary.items() if k not in MEASURED_FIELDS}


def _num(value) -> float | None:
    """JSON-safe float: NaN/inf become null."""
    value = float(value)
    return value if math.isfinite(value) else None


def _pct(values: np.ndarray, q: float) -> float | None:
    return _num(np.percentile(values, q)) if len(values) else None


def _mean(values: np.ndarray) -> float | None:
    return _num(values.mean()) if len(values) else None


def requests_table(result: RunResult) -> pa.Table:
    """Per-request outcomes in row order ((arrival, id) order): deterministic bytes for one seed;
    with KV blocks (``--kv-blocks``) also each request's ``preemptions``."""
    table = pa.table({
        "request_id": pa.array(result.rows_request_id.astype(str).tolist(), pa.string()),
        "arrival_s": pa.array(result.arrival_s, pa.float64()),
        "admit_s": pa.array(result.admit_s, pa.float64()),
        "first_token_s": pa.array(result.first_token_s, pa.float64()),
        "finish_s": pa.array(result.finish_s, pa.float64()),
        "admit_step": pa.array(result.admit_step, pa.int64()),
        "first_token_step": pa.array(result.first_token_step, pa.int64()),
        "finish_step": pa.array(result.finish_step, pa.int64()),
        "output_tokens": pa.array(result.output_tokens, pa.int32()),
        "prompt_tokens": pa.array(result.prompt_tokens, pa.int32()),
        "predicted_tokens": pa.array(result.predicted_tokens, pa.float64(), from_pandas=True),
        "forced_steps": pa.array(result.forced_steps, pa.int32()),
        # a fleet's runs only, so a single engine's file keeps its bytes
        **({"replica": pa.array(result.replica, pa.int32())} if result.replica is not None else {}),
    })
    if result.preemptions is not None:
        table = table.append_column("preemptions", pa.array(result.preemptions, pa.int32()))
    if result.cached_tokens is not None:
        table = table.append_column("cached_tokens", pa.array(result.cached_tokens, pa.int32()))
    for name, values in (result.stages or {}).items():   # a P/D fleet's (simulator.pd_result)
        table = table.append_column(name, pa.array(values, pa.int32() if values.dtype.kind == "i" else pa.float64()))
    return table


def prediction_quality(predicted: np.ndarray, true: np.ndarray, output_kind: str = "length") -> dict:
    from core.metrics import kendall_tau_b, mae_by_bucket, pairwise_order_accuracy, spearman

    mask = np.isfinite(predicted)
    out: dict[str, float | None] = {"spearman": None, "kendall_tau": None, "pairwise_accuracy": None, "mae": None,
           "mae_le256": None, "mae_257_1024": None, "mae_gt1024": None}
    if mask.sum() < 2:
        return out
    p, t = predicted[mask], true[mask].astype(np.float64)
    out["spearman"] = _num(spearman(p, t))
    out["kendall_tau"] = _num(kendall_tau_b(p, t))
    out["pairwise_accuracy"] = _num(pairwise_order_accuracy(p, t))
    if output_kind == "rank":   # a rank score has no length scale: order metrics only
        return out
    buckets = mae_by_bucket(p, t)
    out["mae"] = _num(buckets["overall"])
    out["mae_le256"] = _num(buckets["<=256"]) if buckets.get("<=256") is not None else None
    out["mae_257_1024"] = _num(buckets["257-1024"]) if buckets.get("257-1024") is not None else None
    out["mae_gt1024"] = _num(buckets[">1024"]) if buckets.get(">1024") is not None else None
    return out


def result_latencies(result: RunResult) -> dict[str, np.ndarray]:
    """:func:`core.latency.request_latencies` of a run's requests."""
    return request_latencies(result.arrival_s, result.first_token_s, result.finish_s, result.output_tokens)


def field_latency(result: RunResult, span_s: float, slos: dict[str, float] | None = None,
                  lat: dict[str, np.ndarray] | None = None) -> dict:
    """TTFT, TPOT, ITL, E2EL in ms under vLLM's keys (``core.latency``), token totals, and
    ``request_goodput`` under ``slos`` (ms; null without). The engine keeps each request's first and
    last token times, so ITL is taken from each request's mean gap (docs/semantics.md "Metrics").
    ``lat``: :func:`result_latencies` of ``result``, when the caller has it."""
    lat = result_latencies(result) if lat is None else lat
    done = lat["done"]
    goodput = request_goodput(lat, slos or {}, span_s)
    attained = slo_attainment(lat, slos or {})
    return {**latency_summary(lat, itl_from_request_means(lat)),
            "total_input_tokens": int(result.prompt_tokens[done].sum()),
            "total_output_tokens": int(result.output_tokens[done].sum()),
            "request_goodput": None if goodput is None else _num(goodput),
            "slo_attainment": None if attained is None else _num(attained)}


def summarize(result: RunResult, slos: dict[str, float] | None = None, **context) -> dict:
    """Summary figures of one run; ``context`` (load, capacity, names, seed...) is merged in;
    ``slos``: the goodput SLOs in ms (``--goodput``)."""
    arrival, finish = result.arrival_s, result.finish_s
    out_tok = result.output_tokens.astype(np.float64)
    lat = result_latencies(result)
    done, e2e, ptl, ttft, tpot = lat["done"], lat["e2el"], lat["nl"], lat["ttft"], lat["tpot"]
    start = float(arrival.min()) if len(arrival) else 0.0
    span = result.makespan_s - start
    long_cut = np.percentile(out_tok, 90) if len(out_tok) else 0
    long_decile = (finish - arrival)[done & (out_tok >= long_cut)]
    over = (finish - arrival)[done & (out_tok > LONG_REQUEST_TOKENS)]
    ready_late = (result.predicted_ready_s - result.first_token_s)
    ready_late = ready_late[np.isfinite(ready_late)]
    summary = {
        "arrived": int(len(arrival)),
        "completed": int(done.sum()),
        "mean_ptl_s": _mean(ptl),
        "mean_e2e_s": _mean(e2e),
        "p50_e2e_s": _pct(e2e, 50),
        "p90_e2e_s": _pct(e2e, 90),
        "p95_e2e_s": _pct(e2e, 95),
        "p99_e2e_s": _pct(e2e, 99),
        "mean_ttft_s": _mean(ttft),
        "p95_ttft_s": _pct(ttft, 95),
        "mean_tpot_s": _mean(tpot),
        "long_decile_mean_e2e_s": _mean(long_decile),
        "long_decile_p95_e2e_s": _pct(long_decile, 95),
        "over1024_requests": int(len(over)),
        "over1024_mean_e2e_s": _mean(over),
        "over1024_p95_e2e_s": _pct(over, 95),
        "throughput_tok_s": _num(out_tok[done].sum() / span) if span > 0 else None,
        "throughput_req_s": _num(done.sum() / span) if span > 0 else None,
        "makespan_s": _num(span),
        "steps": int(result.steps),
        "forced_steps": int(result.forced_steps.sum()),
        # share of steps in which the policy's order decided something (more ready requests than
        # decode slots); 0 means every policy gives FCFS's result on this run
        "saturated_share": _num(result.contended_steps / result.steps) if result.steps else None,
        "requests_forced": int((result.forced_steps > 0).sum()),
        "gpu_s_charged": _num(result.gpu_s_charged),
        "predictor_cpu_s": _num(result.predictor_cpu_s),
        "prediction_late_mean_s": _mean(np.maximum(ready_late, 0.0)),
        "updates_published": int(result.updates_published),
        **prediction_quality(result.predicted_tokens, result.output_tokens, result.output_kind),
        "mae_in_use": _num(result.mae_in_use) if result.mae_in_use is not None else None,
        "sim_cpu_s": _num(result.sim_cpu_s),
        **field_latency(result, span, slos, lat),
        **run_metrics(result, lat),   # simulator.run_metrics: one entry a metric
    }
    if result.replica is not None:
        summary.update(fleet_balance(result))
    if result.pd_replicas is not None:
        from simulator.pd_result import pd_summary
        summary.update(pd_summary(result))
    if result.preemptions is not None:   # KV blocks: preemptions in all, and requests preempted at least once
        summary["preemptions"] = int(result.preemptions.sum())
        summary["requests_preempted"] = int((result.preemptions > 0).sum())
    if result.cached_tokens is not None:   # prefix caching: the share of prompt tokens found cached at admission
        prompt = int(result.prompt_tokens.sum())
        summary["prefix_hit_rate"] = _num(result.cached_tokens.sum() / prompt) if prompt else 0.0
    return {**context, **summary}


def fleet_balance(result: RunResult) -> dict:
    """A fleet's balance (docs/semantics.md "Fleets"): requests per replica, max over mean, and
    outstanding true work per replica at each routing, max over mean, averaged over routings
    (1.0 = even; N = everything on one replica)."""
    assert result.replica is not None
    counts = np.bincount(result.replica, minlength=result.replicas).astype(np.float64)
    mean = counts.mean() if len(counts) else 0.0
    return {
        "replicas": int(result.replicas),
        "replica_requests_max_over_mean": _num(counts.max() / mean) if mean > 0 else None,
        "replica_work_max_over_mean": (_num(result.balance_max_over_mean)
                                       if result.balance_max_over_mean is not None else None),
    }
