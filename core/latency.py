"""Latency in the serving field's terms (``vllm bench serve``'s definitions, keys and units).

- TTFT: arrival to first token; E2EL: arrival to last token;
- TPOT: (E2EL - TTFT) / (output tokens - 1), per request, requests of one token left out;
- ITL: the gaps between consecutive tokens of a request, pooled over all requests;
- NL (normalized latency, the project's headline, once called PTL): E2EL / output tokens.

:func:`request_latencies` computes them per request, once for every caller (the simulator's summary,
the studies, the serving metrics, leap-validate).

Each is summarised as mean, median, std and the percentiles :data:`PERCENTILES`, in milliseconds,
under vLLM's key names (``mean_ttft_ms``, ``p99_tpot_ms``...). Goodput is vLLM's: the requests
meeting every given SLO (TPOT of a one-token request counts as 0), per second of the run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

#: the latency metrics, in vLLM's order and spelling
METRICS = ("ttft", "tpot", "itl", "e2el")
#: the SLOs ``--goodput`` accepts (vLLM's VALID_NAMES)
SLO_METRICS = ("ttft", "tpot", "e2el")
#: the percentiles reported beside mean, median and std
PERCENTILES = (50, 90, 99)
#: vLLM's statistics per metric, in its key order
STATS = ("mean", "median", "std", *(f"p{p}" for p in PERCENTILES))
GOODPUT_FLAG_HELP = ("service level objectives in ms, vLLM bench serve's syntax: any of ttft:MS tpot:MS e2el:MS; "
                     "adds request_goodput (requests/s meeting all of them) and slo_attainment (their share "
                     "of the requests); --slo is the same flag")


def stat_keys(metric: str) -> list[str]:
    """The summary keys of one metric: ``mean_ttft_ms``, ``median_ttft_ms``, ``std_ttft_ms``, ``p50_ttft_ms``..."""
    return [f"{stat}_{metric}_ms" for stat in STATS]


def _ms(value: float) -> float | None:
    value = float(value) * 1000.0
    return value if math.isfinite(value) else None


def describe_ms(metric: str, seconds: np.ndarray) -> dict[str, float | None]:
    """Mean, median, std and percentiles of ``seconds``, in ms, under ``metric``'s keys (null if empty)."""
    values = np.asarray(seconds, dtype=np.float64)
    if not len(values):
        return dict.fromkeys(stat_keys(metric))
    figures = [values.mean(), np.median(values), values.std(), *np.percentile(values, PERCENTILES)]
    return {key: _ms(x) for key, x in zip(stat_keys(metric), figures)}


def request_latencies(arrival_s, first_token_s, finish_s, output_tokens) -> dict[str, np.ndarray]:
    """Per completed request (finish known), in row order: ``ttft``, ``e2el``, ``tpot`` (requests of
    more than one token only), ``tpot_all`` (one-token requests at 0, as vLLM's goodput counts them),
    ``nl`` (normalized latency: e2el / output tokens), in seconds; ``tokens`` (float64) and ``done``
    (the completed rows' mask over the input rows). The one place these are computed."""
    arrival, first, finish = (np.asarray(x, dtype=np.float64) for x in (arrival_s, first_token_s, finish_s))
    tokens = np.asarray(output_tokens, dtype=np.float64)
    done = np.isfinite(finish)
    arrival, first, finish, tokens = arrival[done], first[done], finish[done], tokens[done]
    multi = tokens > 1
    tpot_all = np.zeros(len(tokens))
    tpot_all[multi] = (finish[multi] - first[multi]) / (tokens[multi] - 1)
    e2el = finish - arrival
    return {"ttft": first - arrival, "e2el": e2el, "tpot": tpot_all[multi], "tpot_all": tpot_all,
            "nl": e2el / tokens, "tokens": tokens, "done": done}


def gaps_from_token_times(token_times: Sequence[Sequence[float] | None]) -> np.ndarray:
    """ITL exactly: every gap between consecutive token times of each request, pooled in request order."""
    parts = [np.diff(np.asarray(t, dtype=np.float64)) for t in token_times if t is not None and len(t) > 1]
    return np.concatenate(parts) if parts else np.empty(0)


def weighted_describe_ms(metric: str, seconds: np.ndarray, counts: np.ndarray) -> dict[str, float | None]:
    """:func:`describe_ms` of ``seconds`` each repeated ``counts`` times, without making that array
    (a long run has millions of tokens): the same mean, median, std and linear percentiles."""
    values = np.asarray(seconds, dtype=np.float64)
    weights = np.asarray(counts, dtype=np.int64)
    keep = weights > 0
    values, weights = values[keep], weights[keep]
    total = int(weights.sum())
    if total == 0:
        return dict.fromkeys(stat_keys(metric))
    order = np.argsort(values, kind="stable")
    values, weights = values[order], weights[order]
    ends = np.cumsum(weights)                   # position after each value's last copy

    def at(position: int) -> float:             # the sorted repeated array's element at position
        return float(values[np.searchsorted(ends, position, side="right")])

    def percentile(q: float) -> float:          # numpy's default (linear) method
        exact = q / 100.0 * (total - 1)
        lo = math.floor(exact)
        below, above = at(lo), at(min(lo + 1, total - 1))
        return below + (above - below) * (exact - lo)

    mean = float((values * weights).sum() / total)
    std = math.sqrt(float((weights * (values - mean) ** 2).sum() / total))
    figures = [mean, percentile(50), std, *(percentile(p) for p in PERCENTILES)]
    return {key: _ms(x) for key, x in zip(stat_keys(metric), figures)}


def itl_from_request_means(lat: dict[str, np.ndarray]) -> dict[str, float | None]:
    """ITL where only each request's first and last token times are kept (the simulator): a request
    of L tokens contributes L - 1 gaps at its own mean gap, its TPOT. The pooled mean is exact; the
    spread between one request's gaps is not seen (docs/semantics.md "Metrics")."""
    multi = lat["tokens"] > 1
    return weighted_describe_ms("itl", lat["tpot_all"][multi], lat["tokens"][multi] - 1)


def latency_summary(lat: dict[str, np.ndarray], itl: dict[str, float | None]) -> dict[str, float | None]:
    """Every metric's statistics in ms under vLLM's keys: TTFT, TPOT, ITL (``itl``: from
    :func:`gaps_from_token_times` via :func:`describe_ms`, or :func:`itl_from_request_means`), E2EL."""
    return {**describe_ms("ttft", lat["ttft"]), **describe_ms("tpot", lat["tpot"]), **itl,
            **describe_ms("e2el", lat["e2el"])}


def parse_goodput(items: Sequence[str] | None) -> dict[str, float]:
    """``["ttft:200", "tpot:50"]`` -> {"ttft": 200.0, "tpot": 50.0} (ms). ValueError says what is wrong."""
    slos: dict[str, float] = {}
    for item in items or ():
        name, sep, value = item.partition(":")
        name = name.strip().lower()
        if not sep or name not in SLO_METRICS:
            raise ValueError(f"{item!r}: expected KEY:MS with KEY one of {', '.join(SLO_METRICS)}, e.g. ttft:500")
        if name in slos:
            raise ValueError(f"{item!r}: {name} is given twice")
        try:
            ms = float(value)
        except ValueError:
            raise ValueError(f"{item!r}: {value.strip()!r} is not a number of milliseconds") from None
        if not math.isfinite(ms) or ms < 0:
            raise ValueError(f"{item!r}: the SLO must be a finite number of ms >= 0")
        slos[name] = ms
    return slos


def good_requests(lat: dict[str, np.ndarray], slos: dict[str, float]) -> int:
    """How many completed requests meet every SLO (value <= SLO; vLLM: one-token TPOT counts as 0)."""
    columns = {"ttft": lat["ttft"], "tpot": lat["tpot_all"], "e2el": lat["e2el"]}
    good = np.ones(len(lat["e2el"]), dtype=bool)
    for name, ms in slos.items():
        good &= columns[name] <= ms / 1000.0
    return int(good.sum())


def slo_attainment(lat: dict[str, np.ndarray], slos: dict[str, float]) -> float | None:
    """The share of the completed requests meeting every SLO (DistServe's attainment)."""
    if not slos or len(lat["e2el"]) == 0:
        return None
    return good_requests(lat, slos) / len(lat["e2el"])


def request_goodput(lat: dict[str, np.ndarray], slos: dict[str, float], duration_s: float) -> float | None:
    """Requests per second meeting every SLO; null without SLOs or without a duration."""
    if not slos or not duration_s > 0:
        return None
    return good_requests(lat, slos) / duration_s
