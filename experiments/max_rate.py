"""``simulate --find-max-rate``: the highest arrival rate at which at least 90% of requests meet
every SLO (``--slo``; DistServe's "SLO attainment" measure), for the aggregated fleet of the run's
engine count and, for a P/D run, the P/D fleet, side by side.

The search is over the load (multiples of the fleet's capacity, docs/semantics.md "Fleets": N x one
engine's measured FCFS capacity, the same N for both fleets), each probe a whole run at the run's
seed: probe 1x, double while attained (up to :data:`MAX_LOAD`), then bisect the bracket until it is
narrower than :data:`TOLERANCE`. Deterministic: the same command probes the same loads and prints the
same figures. The answer is the highest probed load that attains (0 if none down to the tolerance)."""

from __future__ import annotations

import dataclasses
import json

from simulator.runner import RunConfig, execute, prepare

TARGET = 0.90       # share of requests meeting every SLO
TOLERANCE = 0.01    # the bracket's width at the end, in multiples of the fleet's capacity
MAX_LOAD = 16.0     # the doubling stops here (reported as ">=")


def _attainment(config: RunConfig, load: float, probes: list) -> float:
    summary, _ = execute(prepare(dataclasses.replace(config, load=load)))
    value = summary.get("slo_attainment")
    attained = float(value) if value is not None else 0.0
    probes.append((load, attained, summary.get("capacity_req_s")))
    return attained


def max_load(config: RunConfig) -> dict:
    """The bisection for one fleet: its highest attaining load, the rate, and every probe."""
    probes: list = []
    lo, hi = 0.0, 1.0
    while _attainment(config, hi, probes) >= TARGET:
        lo = hi
        if hi >= MAX_LOAD:
            break
        hi *= 2
    if lo < hi:
        while hi - lo > TOLERANCE:
            mid = round((lo + hi) / 2, 6)
            if _attainment(config, mid, probes) >= TARGET:
                lo = mid
            else:
                hi = mid
    capacity = probes[0][2]
    at = next((a for load, a, _ in probes if load == lo), None)
    return {"max_load": lo, "max_rate_req_s": lo * capacity if capacity else None, "capacity_req_s": capacity,
            "attainment_at_max": at, "capped": lo >= MAX_LOAD, "probes": [[p[0], p[1]] for p in probes]}


def _label(config: RunConfig) -> str:
    if config.prefill_replicas:
        return (f"P/D {config.prefill_replicas}+{config.decode_replicas} (prefill {config.router}, "
                f"decode {config.decode_router or 'round-robin'})")
    return f"aggregated {config.replicas} ({config.router})"


def find_max_rate(config: RunConfig, as_json: bool) -> int:
    fleets = [config]
    if config.prefill_replicas:
        aggregated = dataclasses.replace(config, prefill_replicas=0, decode_replicas=0, decode_router=None,
                                         replicas=config.prefill_replicas + config.decode_replicas)
        fleets = [aggregated, config]
    rows = []
    for fleet in fleets:
        found = max_load(fleet)
        rows.append({"fleet": _label(fleet), "engines": fleet.prefill_replicas + fleet.decode_replicas
                     if fleet.prefill_replicas else fleet.replicas, "predictor": fleet.predictor,
                     "policy": fleet.policy, "seed": fleet.seed, "slo": dict(fleet.goodput), "target": TARGET,
                     "tolerance_x": TOLERANCE, **found})
    if as_json:
        for row in rows:
            print(json.dumps(row, sort_keys=True), flush=True)
        return 0
    slo = ", ".join(f"{k} <= {v:g} ms" for k, v in config.goodput)
    print(f"max arrival rate with >= {TARGET:.0%} of requests meeting {slo} "
          f"(predictor {config.predictor}, policy {config.policy}, seed {config.seed}; bisection to "
          f"{TOLERANCE}x capacity)")
    print(f"{'fleet':<58} {'engines':>7} {'max rate req/s':>15} {'x capacity':>11} {'attained':>9} {'probes':>6}")
    for row in rows:
        rate = "n/a" if row["max_rate_req_s"] is None else f"{row['max_rate_req_s']:.2f}"
        load = f"{'>=' if row['capped'] else ''}{row['max_load']:.3f}"
        at = "-" if row["attainment_at_max"] is None else f"{row['attainment_at_max']:.3f}"
        print(f"{row['fleet']:<58} {row['engines']:>7} {rate:>15} {load:>11} {at:>9} {len(row['probes']):>6}")
    return 0
