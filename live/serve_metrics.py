"""A ``leap-serve`` run in the serving field's terms, read back from the serving trace it wrote:
TTFT, TPOT, ITL (exact: every gap of ``token_times_s``), E2EL in ms under vLLM bench serve's keys,
``request_goodput`` under ``--goodput``, a few lines on the console and ``--save-result FILE.json``
(:mod:`core.bench_result`). Times are the client's: from each request's send (``arrival_s``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from core.bench_result import bench_result, run_fields
from core.io import atomic_write_json
from core.latency import describe_ms, gaps_from_token_times, latency_summary, request_goodput, request_latencies

BACKEND = "leap-sched leap-serve"
COLUMNS = ("arrival_s", "ttft_s", "e2e_s", "token_times_s", "output_tokens", "prompt_tokens")


def trace_result(path: Path, slos: dict[str, float], label: str, request_rate: float | None) -> dict:
    """The saved-result dict of the serving trace at ``path``. Duration: first send to last token
    (segments of a resumed run are shifted onto the planned time axis, docs/serving.md)."""
    import pyarrow.parquet as pq

    table = pq.read_table(path, columns=list(COLUMNS)).to_pydict()
    arrival = np.asarray(table["arrival_s"], dtype=np.float64)
    ttft = np.array([np.nan if x is None else x for x in table["ttft_s"]], dtype=np.float64)
    e2e = np.array([np.nan if x is None else x for x in table["e2e_s"]], dtype=np.float64)
    tokens = np.asarray(table["output_tokens"], dtype=np.float64)
    lat = request_latencies(np.zeros(len(e2e)), ttft, e2e, tokens)
    done = np.isfinite(e2e)
    duration = float(np.max(arrival[done] + e2e[done]) - np.min(arrival)) if done.any() else 0.0
    goodput = request_goodput(lat, slos, duration)
    latency = latency_summary(lat, describe_ms("itl", gaps_from_token_times(table["token_times_s"])))
    run = run_fields(backend=BACKEND, label=label, num_prompts=len(e2e), request_rate=request_rate,
                     max_concurrency=None, duration=duration, completed=int(done.sum()),
                     input_tokens=int(np.asarray(table["prompt_tokens"], dtype=np.int64)[done].sum()),
                     output_tokens=int(tokens[done].sum()), goodput=goodput)
    return bench_result(run, latency)


def summary_lines(result: dict) -> list[str]:
    """Console lines: one per metric (mean, median, p90, p99 in ms), throughput and goodput."""
    lines = []
    for metric in ("ttft", "tpot", "itl", "e2el"):
        figures = [result[f"{stat}_{metric}_ms"] for stat in ("mean", "median", "p90", "p99")]
        text = " / ".join("-" if x is None else f"{x:.1f}" for x in figures)
        lines.append(f"{metric.upper():<4} ms mean / median / p90 / p99: {text}")
    throughput = result["request_throughput"]
    line = f"{result['completed']} of {result['num_prompts']} requests in {result['duration']:.1f} s"
    if throughput is not None:
        line += f": {throughput:.3f} req/s, {result['output_throughput']:.1f} output tok/s"
    if result["request_goodput"] is not None:
        line += f", goodput {result['request_goodput']:.3f} req/s"
    return [*lines, line]


def report(args, out: Path, slos: dict[str, float], log) -> None:
    """After a run wrote ``out``: log its field metrics; write ``--save-result`` if asked. The
    request rate is the run's planned one (null under the step clock: it is per step there)."""
    from core.trace import load_trace

    rate = (load_trace(out).metadata.get("serving") or {}).get("rate_req_s")
    result = trace_result(out, slos, Path(out).stem, rate)
    for line in summary_lines(result):
        log(line)
    if args.save_result is not None:
        atomic_write_json(Path(args.save_result), result)
        log(f"wrote {args.save_result}")
