"""A run's prefill/decode settings (docs/semantics.md "Prefill/decode disaggregation"): checked
when the run is configured, and the :class:`simulator.pd_fleet.PDFleet` it prepares."""

from __future__ import annotations

from typing import Any

import numpy as np

from routers import MAX_REPLICAS, check_stage_router, make_router
from simulator.compiled import note_fallback
from simulator.pd_link import KVLink

#: simulator.runner's RunConfig and Prepared (not imported: the runner imports this module)
RunConfig = Any
Prepared = Any

#: RunConfig fields of a P/D fleet (left out of the config.json of other runs)
PD_FIELDS = ("prefill_replicas", "decode_replicas", "decode_router", "kv_link_gbps", "kv_link_latency_ms")


def _count(flag: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= value <= MAX_REPLICAS:
        raise ValueError(f"{flag} must be an integer from 1 to {MAX_REPLICAS}, got {value!r}")
    return int(value)


def fleet_size(config: RunConfig) -> int:
    """Engines in the run: P + D for a P/D fleet, else the replicas (capacity is this x one engine's)."""
    return config.prefill_replicas + config.decode_replicas if config.prefill_replicas else config.replicas


def check_pd(config: RunConfig) -> None:
    """P and D both >= 1 or both 0, a decode router only with them (and able to place decodes, with a
    predictor that serves it), the link's numbers, and what a P/D fleet does not model."""
    from predictors import PREDICTORS

    if not config.prefill_replicas and not config.decode_replicas:
        if config.decode_router is not None:
            raise ValueError("--decode-router places decodes of a prefill/decode fleet: give --prefill-replicas "
                             "and --decode-replicas")
        return
    _count("--prefill-replicas", config.prefill_replicas)
    _count("--decode-replicas", config.decode_replicas)
    if config.replicas != 1:
        raise ValueError("--replicas is an aggregated fleet; a P/D fleet is --prefill-replicas and --decode-replicas")
    check_stage_router("--decode-router", "decode", config.decode_router or "round-robin", PREDICTORS,
                       config.predictor)
    KVLink(config.kv_link_gbps, config.kv_link_latency_ms)
    if config.arrivals.kind == "closed" or config.arrivals.step_clock:
        raise ValueError(f"--prefill-replicas: --arrivals {config.arrivals.describe()} is not modelled in a P/D "
                         "fleet (open arrivals: poisson, trace, FILE.csv, recorded)")


def prepared_pd(config: RunConfig, workload, trace, arrival_s, capacity, rate, engine_config, profile,
                prepared_fleet) -> Prepared:
    """The run's P/D fleet: on the compiled kernel where it replays the reference byte for byte
    (:func:`simulator.compiled_pd.pd_unsupported`), else the reference engine, noted once per reason;
    ``prepared_fleet``: the runner's, which resolves a fleet's run (this module does not import it)."""
    from policies import make_policy
    from predictors import NO_PREDICTOR, make_predictor
    from simulator.compiled_pd import CompiledPDFleet, pd_unsupported
    from simulator.pd_fleet import PDFleet

    if engine_config.kv_token_budget is not None:
        raise ValueError("--kv-budget is one engine's KV model; a P/D fleet models KV blocks (--kv-blocks)")
    fleet_class: type[PDFleet] = PDFleet
    if config.kernel == "compiled":
        predictor = None if config.predictor == NO_PREDICTOR else make_predictor(config.predictor, config.predictor_options)
        reason = pd_unsupported(engine_config, make_policy(config.policy, config.policy_options, config.goodput),
                                predictor, profile)
        if reason is None:
            fleet_class = CompiledPDFleet
        else:
            note_fallback(f"a P/D fleet: {reason}")
    decode_router = make_router(config.decode_router or "round-robin")
    link = KVLink(config.kv_link_gbps, config.kv_link_latency_ms)

    def build(*args, replicas: int, **kwargs):   # replicas: the config's 1 (the prefill side is P)
        return fleet_class(*args, prefill_replicas=config.prefill_replicas, decode_replicas=config.decode_replicas,
                       decode_router=decode_router, link=link, **kwargs)

    prepared = prepared_fleet(config, workload, trace, arrival_s, capacity, rate, engine_config, profile,
                               build=build)
    prepared.resolved["decode_router_settings"] = decode_router.describe()
    return prepared
