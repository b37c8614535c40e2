"""``--save-result FILE.json``: one run's figures under ``vllm bench serve``'s result keys and units
(ms for latencies, seconds for ``duration``, per second for throughputs), so that a simulated or
served run sits on the same dashboards as a vLLM benchmark.

The key set is committed in ``core/vllm_bench_keys.json`` with the vLLM version it was read from;
``tests/test_latency.py`` holds it against the installed vLLM's ``benchmarks/serve.py`` where there
is one. vLLM's per-request lists (``ttfts``, ``itls``...) are left out: ``requests.parquet`` (a
simulated run) and the serving trace (a served one) hold them.
"""

from __future__ import annotations

import argparse
import json
from functools import cache
from pathlib import Path

from core.checks import check_writable, output_path
from core.errors import UsageError
from core.latency import GOODPUT_FLAG_HELP, METRICS, parse_goodput, stat_keys

KEYS_FILE = Path(__file__).with_name("vllm_bench_keys.json")
#: the run-level keys, in vLLM's order; then each metric's statistics (:func:`core.latency.stat_keys`)
RUN_KEYS = ("backend", "label", "num_prompts", "request_rate", "max_concurrency", "duration", "completed",
            "failed", "total_input_tokens", "total_output_tokens", "request_throughput", "request_goodput",
            "output_throughput", "total_token_throughput")


def result_keys() -> list[str]:
    """Every key a saved result holds, in order."""
    return [*RUN_KEYS, *(key for metric in METRICS for key in stat_keys(metric))]


@cache
def committed_keys() -> dict:
    """The committed key list: {"vllm_version": ..., "keys": [...]}."""
    return json.loads(KEYS_FILE.read_text())


def bench_result(run: dict, latency: dict) -> dict:
    """The saved result: ``run`` (the run-level keys of :data:`RUN_KEYS`) and ``latency`` (the
    statistics, :func:`core.latency.latency_summary`'s keys). A key missing from both is refused:
    the file always has vLLM's whole key set."""
    merged = {**run, **latency}
    missing = [k for k in result_keys() if k not in merged]
    if missing:
        raise KeyError(f"a saved result needs {', '.join(missing)}")
    return {k: merged[k] for k in result_keys()}


def add_result_flags(p: argparse.ArgumentParser, save_help: str) -> None:
    """``--goodput KEY:MS...`` and ``--save-result FILE.json``, the same on every command that has them."""
    p.add_argument("--goodput", "--slo", dest="goodput", nargs="+", metavar="KEY:MS", help=GOODPUT_FLAG_HELP)
    p.add_argument("--save-result", type=output_path, metavar="FILE.json", help=save_help)


def goodput_slos(items: list[str] | None) -> dict[str, float]:
    """``--goodput`` (or its other name ``--slo``) parsed, or one line naming the flag
    (:class:`core.errors.UsageError`)."""
    try:
        return parse_goodput(items)
    except ValueError as exc:
        raise UsageError(f"--goodput/--slo {exc}") from None


def check_save_result(path: Path | None) -> None:
    """Refuse a ``--save-result`` path that is a folder or cannot be written, before any work."""
    if path is None:
        return
    if Path(path).is_dir():
        raise UsageError(f"--save-result {path}: is a folder; name a .json file")
    check_writable("--save-result", Path(path))


def run_fields(*, backend: str, label: str, num_prompts: int, request_rate: float | None,
               max_concurrency: int | None, duration: float, completed: int, input_tokens: int,
               output_tokens: int, goodput: float | None) -> dict:
    """vLLM's run-level result keys (:data:`RUN_KEYS`) from a run's totals; throughputs per second
    of ``duration`` (null for a run of no duration)."""
    def per_s(x):
        return x / duration if duration > 0 else None
    return {"backend": backend, "label": label, "num_prompts": num_prompts, "request_rate": request_rate,
            "max_concurrency": max_concurrency, "duration": duration, "completed": completed,
            "failed": num_prompts - completed, "total_input_tokens": input_tokens,
            "total_output_tokens": output_tokens, "request_throughput": per_s(completed),
            "request_goodput": goodput, "output_throughput": per_s(output_tokens),
            "total_token_throughput": per_s(input_tokens + output_tokens)}
