"""``simulate``'s flags for the serving field's metrics: ``--goodput ttft:MS tpot:MS e2el:MS``
(vLLM bench serve's syntax; adds ``request_goodput`` to every run's summary) and ``--save-result
FILE.json`` (one run's figures under vLLM bench serve's result keys, :mod:`core.bench_result`).

``--save-result`` writes one run: a command that plans several is refused before anything runs
(each run's ``summary.json`` under ``--out`` holds the same figures under the same key names).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from core.bench_result import add_result_flags, bench_result, check_save_result, goodput_slos, run_fields
from core.errors import UsageError
from core.io import atomic_write_json
from core.latency import METRICS, stat_keys

BACKEND = "leap-sched simulate"


def add_field_metric_flags(p: argparse.ArgumentParser) -> None:
    add_result_flags(p, "write the run's figures under vllm bench serve's result keys and units (one run only)")


def with_goodput(args, configs: list) -> list:
    """The runs with ``--goodput``'s SLOs (a ``--config`` run keeps its own unless given); refuses a
    bad SLO, and ``--save-result`` for more than one run or at a path it cannot write."""
    if args.goodput is not None:
        slos = goodput_slos(args.goodput)
        configs = [dataclasses.replace(c, goodput=tuple(slos.items())) for c in configs]
    if args.save_result is not None and len(configs) > 1:
        raise UsageError(f"--save-result writes one run's result; this command plans {len(configs)} runs "
                         "(narrow it to one, or use --out: each run's summary.json has the same keys)")
    check_save_result(args.save_result)
    return configs


def save_result(path: Path, summary: dict, config) -> None:
    """Write ``summary`` as a vLLM bench serve result (atomically; same run, same bytes)."""
    from experiments.sweep import run_slug

    window = config.arrivals.window if config.arrivals.kind == "closed" else None
    latency = {key: summary.get(key) for metric in METRICS for key in stat_keys(metric)}
    run = run_fields(backend=BACKEND, label=run_slug(config), num_prompts=summary["arrived"],
                     request_rate=summary.get("arrival_rate_req_s"), max_concurrency=window,
                     duration=summary["makespan_s"], completed=summary["completed"],
                     input_tokens=summary["total_input_tokens"], output_tokens=summary["total_output_tokens"],
                     goodput=summary.get("request_goodput"))
    atomic_write_json(Path(path), bench_result(run, latency))
