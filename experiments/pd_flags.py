"""``simulate``'s prefill/decode flags (docs/semantics.md "Prefill/decode disaggregation") and
``--find-max-rate`` (the highest arrival rate at which >= 90% of requests meet every SLO,
DistServe's measure, for the aggregated fleet of the same engine count and the P/D fleet side by
side: :mod:`experiments.max_rate`)."""

from __future__ import annotations

import argparse
import dataclasses
import math

from core.checks import bounded_int
from core.errors import UsageError
from routers import DECODE_ROUTERS, MAX_REPLICAS
from simulator.pd_link import DEFAULT_KV_LINK_GBPS, DEFAULT_KV_LINK_LATENCY_MS


def _number(minimum: float, strict: bool):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value) or value < minimum or (strict and value == minimum):
            raise argparse.ArgumentTypeError(f"must be a finite number {'>' if strict else '>='} {minimum:g}, "
                                             f"got {text!r}")
        return value
    return parse


def add_pd_flags(p: argparse.ArgumentParser) -> None:
    count = bounded_int(1, MAX_REPLICAS, "engines one fleet simulates")
    decode = ", ".join(DECODE_ROUTERS)
    p.add_argument("--prefill-replicas", type=count, help="a prefill/decode fleet: this many prefill instances "
                   "(with --decode-replicas; --router places the prefills)")
    p.add_argument("--decode-replicas", type=count, help="a prefill/decode fleet: this many decode instances")
    p.add_argument("--decode-router", help=f"how a P/D fleet places each prefilled request on a decode instance: "
                   f"{decode} (default round-robin)")
    p.add_argument("--kv-link-gbps", type=_number(0.0, True), default=DEFAULT_KV_LINK_GBPS,
                   help=f"KV link from prefill to decode instance, Gbit/s (default {DEFAULT_KV_LINK_GBPS:g}: one "
                        "400 Gb/s InfiniBand port per H100, as in a DGX H100)")
    p.add_argument("--kv-link-latency-ms", type=_number(0.0, False), default=DEFAULT_KV_LINK_LATENCY_MS,
                   help=f"fixed latency of each KV transfer, ms (default {DEFAULT_KV_LINK_LATENCY_MS:g})")
    p.add_argument("--find-max-rate", action="store_true", help="bisect the arrival rate for the highest at which "
                   ">= 90%% of requests meet every --slo, for the aggregated fleet of the same engine count and (with "
                   "--prefill-replicas/--decode-replicas) the P/D fleet, printed side by side")


def with_pd(args, configs: list) -> list:
    """The runs with the P/D flags; bad combinations refused in one line before anything runs."""
    given = args.prefill_replicas is not None, args.decode_replicas is not None
    if any(given) and not all(given):
        missing = "--decode-replicas" if given[0] else "--prefill-replicas"
        raise UsageError(f"a prefill/decode fleet needs both counts: give {missing} too")
    if not any(given):
        if args.decode_router is not None:
            raise UsageError("--decode-router places decodes of a prefill/decode fleet: give --prefill-replicas "
                             "and --decode-replicas")
        for flag, value, default in (("--kv-link-gbps", args.kv_link_gbps, DEFAULT_KV_LINK_GBPS),
                                     ("--kv-link-latency-ms", args.kv_link_latency_ms, DEFAULT_KV_LINK_LATENCY_MS)):
            if value != default:
                raise UsageError(f"{flag} is the KV link of a prefill/decode fleet: give --prefill-replicas "
                                 "and --decode-replicas")
        return configs
    if args.replicas != 1:
        raise UsageError("--replicas is an aggregated fleet; a P/D fleet is --prefill-replicas and --decode-replicas")
    try:
        return [dataclasses.replace(c, prefill_replicas=args.prefill_replicas, decode_replicas=args.decode_replicas,
                                    decode_router=args.decode_router, kv_link_gbps=args.kv_link_gbps,
                                    kv_link_latency_ms=args.kv_link_latency_ms) for c in configs]
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def check_find_max_rate(args, configs: list) -> None:
    """``--find-max-rate``: with --slo, one run's settings (one predictor, policy, seed), rates it
    chooses itself (no --load; rate-driven arrivals), results it prints (no --out)."""
    if not args.find_max_rate:
        return
    if args.goodput is None:
        raise UsageError("--find-max-rate needs --slo (e.g. --slo ttft:2000 tpot:100): the rate is the highest "
                         "at which >= 90% of requests meet every SLO")
    if args.load is not None:
        raise UsageError("--find-max-rate chooses the rates itself: drop --load")
    if len(configs) != 1:
        raise UsageError(f"--find-max-rate searches one run's rate; this command plans {len(configs)} "
                         "(give one --predictor, one --policy, one seed)")
    if configs[0].arrivals.as_recorded:
        raise UsageError(f"--find-max-rate scales the arrival rate: --arrivals {args.arrivals} replays as recorded")
    for flag in ("out", "save_result", "config"):
        if getattr(args, flag) is not None:
            raise UsageError(f"--find-max-rate prints its rates: drop --{flag.replace('_', '-')}")
