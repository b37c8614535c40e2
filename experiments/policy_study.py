"""The policies compared over seeds: ``simulate --json`` lines in, a Markdown table with 95%
t-intervals (``experiments.fleet_study.interval``) and a mean-vs-tail frontier plot out.

    simulate --trace sharegpt --load 1.5x --seeds 5 --json --slo ttft:2000 tpot:100 \\
        --predictor leap-rls --policy fcfs,countdown,slack-countdown > runs.jsonl
    python -m experiments.policy_study runs.jsonl [more.jsonl=LABEL ...] [--plot frontier.png]

One row per (trace, load, predictor, policy): each figure is the mean over seeds ± its 95%
t-interval; "NL vs FCFS" is the paired change against FCFS under the same predictor (its
prediction cost charged alike) on the same seed, and against FCFS without a predictor where the
file has no such run. The plot puts each row at (mean NL, p99 e2e).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from core.errors import UsageError, run_command
from experiments.fleet_study import interval

#: (column, summary key, scale)
METRICS = (("mean NL (s/token)", "mean_ptl_s", 1.0), ("p99 e2e (s)", "p99_e2e_s", 1.0),
           ("p99 TPOT (ms)", "p99_tpot_ms", 1.0), ("mean TTFT (s)", "mean_ttft_s", 1.0),
           ("p99 TTFT (s)", "p99_ttft_ms", 0.001), ("SLO attainment", "slo_attainment", 1.0),
           ("goodput (req/s)", "request_goodput", 1.0))


def read_runs(paths: list[Path], labels: dict[Path, str] | None = None) -> list[dict]:
    """Every summary line of the files (one JSON object a line, as ``simulate --json`` writes); a
    file's label (``FILE=LABEL``: runs with a setting) is added to the names of its policies but FCFS."""
    runs = []
    for path in paths:
        label = (labels or {}).get(path)
        try:
            lines = path.read_text().splitlines()
        except OSError as exc:
            raise UsageError(f"{path}: cannot read it ({exc.strerror or exc})") from None
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                run = json.loads(line)
            except ValueError:
                raise UsageError(f"{path}:{number}: not a JSON line of simulate --json") from None
            if not isinstance(run, dict) or "mean_ptl_s" not in run or "seed" not in run:
                raise UsageError(f"{path}:{number}: not a run summary (no mean_ptl_s or seed)")
            if label and run["policy"] != "fcfs":
                run = {**run, "policy": f"{run['policy']} ({label})"}
            runs.append(run)
    if not runs:
        raise UsageError("no runs in the given files")
    return runs


def _group(run: dict) -> tuple:
    return (run["trace"], run["load"], run["predictor"], run["policy"])


def rows(runs: list[dict]) -> list[dict]:
    """One row per (trace, load, predictor, policy): figures as (mean, half-width) over seeds."""
    by: dict[tuple, dict[int, dict]] = {}
    for run in runs:
        by.setdefault(_group(run), {})[run["seed"]] = run
    out = []
    for key, seeds in by.items():
        trace, load, predictor, policy = key
        base = by.get((trace, load, predictor, "fcfs")) or by.get((trace, load, "none", "fcfs")) or {}
        row = {"trace": trace, "load": load, "predictor": predictor, "policy": policy, "seeds": sorted(seeds)}
        for _, metric, scale in METRICS:
            values = [seeds[s].get(metric) for s in sorted(seeds)]
            known = [float(v) * scale for v in values if v is not None]
            row[metric] = interval(known) if len(known) == len(values) else (float("nan"), float("nan"))
        paired = [seeds[s]["mean_ptl_s"] / base[s]["mean_ptl_s"] - 1 for s in sorted(seeds) if s in base]
        tail = [seeds[s]["p99_e2e_s"] / base[s]["p99_e2e_s"] - 1 for s in sorted(seeds) if s in base]
        row["nl_vs_fcfs"] = interval(paired) if paired else (float("nan"), float("nan"))
        row["p99_vs_fcfs"] = interval(tail) if tail else (float("nan"), float("nan"))
        out.append(row)
    return out


def _cell(pair: tuple[float, float], percent: bool = False) -> str:
    mean, half = pair
    if not np.isfinite(mean):
        return "-"
    if percent:
        return f"{100 * mean:+.1f}% ± {100 * half:.1f}" if np.isfinite(half) else f"{100 * mean:+.1f}%"
    return f"{mean:.3g} ± {half:.2g}" if np.isfinite(half) else f"{mean:.3g}"


def markdown(table: list[dict]) -> str:
    head = ["trace", "load", "predictor", "policy", "seeds", METRICS[0][0], "NL vs FCFS", METRICS[1][0],
            "p99 e2e vs FCFS", *[m[0] for m in METRICS[2:]]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in table:
        cells = [r["trace"], f"{r['load']:g}x", r["predictor"], r["policy"], str(len(r["seeds"])),
                 _cell(r["mean_ptl_s"]), _cell(r["nl_vs_fcfs"], True), _cell(r["p99_e2e_s"]),
                 _cell(r["p99_vs_fcfs"], True), *[_cell(r[m[1]]) for m in METRICS[2:]]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(table: list[dict], path: Path) -> None:
    """Mean NL against p99 e2e, one point per (predictor, policy), with their intervals."""
    from experiments.plots import _pyplot, _save

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for r in table:
        if r["policy"] == "fcfs" and r["predictor"] != "none":
            continue   # FCFS reads no estimate: one point for it
        (x, dx), (y, dy) = r["mean_ptl_s"], r["p99_e2e_s"]
        marker = {"none": "o", "oracle": "s"}.get(r["predictor"], "^")
        ax.errorbar(x, y, xerr=dx, yerr=dy, fmt=marker, capsize=2)
        ax.annotate(f"{r['policy']} ({r['predictor']})", (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("mean normalized latency (s / output token)")
    ax.set_ylabel("p99 end-to-end latency (s)")
    ax.set_title("mean vs tail (o: no predictor, ^: leap-rls, s: oracle)")
    ax.grid(alpha=0.3)
    _save(fig, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="policy_study", description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", help="simulate --json output files; FILE=LABEL adds LABEL to the "
                    "names of the file's policies (runs with a --setting)")
    ap.add_argument("--plot", type=Path, help="write the mean-vs-tail frontier plot here (PNG)")
    args = ap.parse_args(argv)
    given = [(Path(f.partition("=")[0]), f.partition("=")[2]) for f in args.files]
    runs = read_runs([p for p, _ in given], {p: label for p, label in given if label})
    table = sorted(rows(runs), key=lambda r: (r["trace"], r["load"], r["predictor"] != "none",
                                                               r["predictor"], r["mean_ptl_s"][0]))
    sys.stdout.write(markdown(table))
    if args.plot is not None:
        plot(table, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(run_command(main, None, "policy_study"))
