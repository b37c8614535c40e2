"""``leap-report``: the paper's experiments on the bundled traces, as one Markdown report.

Sections (each skipped with a note when its traces or predictors are not available):
- Table 3 analogue: every predictor, prediction cost charged, serving trace, one load;
- Table 4 analogue: train on lmsys, serve alpaca / math / multilingual at 1.5x, no prediction
  cost, the same waiting protection (TIE's exponential aging) for every method;
- prediction quality (Spearman) per predictor and domain, trained on lmsys;
- Table 2 analogue: TRAIL and LEAP with and without decode-time refresh;
- Fig. 6 analogue: load sweep with plots;
- arrivals replayed from the Azure 2023 conversation trace.

    leap-report                                  # full sizes -> docs/report.md + docs/report/*.png
    leap-report --requests 300 --out /tmp/rep    # reduced sizes (CI)
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from predictors import PREDICTORS
from predictors.base import PredictorOptions
from simulator.io import DATA_DIR_ENV, DataDirMissing, atomic_write_bytes, data_dir
from simulator.runner import NO_PREDICTOR, RunConfig
from simulator.sweep import add_relative_changes, run_many, run_slug, write_results
from simulator.trace import TraceError, bundled_trace_names, load_trace
from simulator.workload import ArrivalSpec, parse_load

ROOT = Path(__file__).resolve().parent.parent
AZURE_CONV = Path("arrivals") / "AzureLLMInferenceTrace_conv.csv"     # under the shared data folder
BASELINES = ("tie", "ssjf", "ltr", "trail", "egtp")
PAPER_TABLE3 = ("Paper (real engine, ShareGPT 2.65 req/s, cost included): LEAP's mean PTL is 15.9% below "
                "LTR and 40.8% below TRAIL; throughput +1.9% over LTR; TTFT about equal to FCFS.")
PAPER_TABLE4 = ("Paper (simulation, 1.5x FCFS capacity, no cost, exponential aging): Aya mean response "
                "time frozen LEAP 180.59 s -> LEAP+RLS 161.18 s; MATH: TIE 118.34 s -> LEAP 100.94 s -> "
                "LEAP+RLS 94.36 s; on MATH, LEAP, LEAP+RLS and TIE have higher P95 than FCFS.")
PAPER_TABLE2 = ("Paper: refreshing during decode lowers prediction error but worsens mean response time "
                "(LEAP +8.37% to +9.42%, TRAIL +9.16% to +12.89%) because re-prediction costs time.")


def _fmt(value, spec=".3f"):
    if value is None or (isinstance(value, float) and value != value):  # NaN: e.g. the rank
        return "-"                                                       # correlation of a constant
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def _pct(value):
    return "-" if value is None or value != value else f"{value:+.1%}"


def markdown_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    head = "| " + " | ".join(c[0] for c in columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    body = []
    for r in rows:
        cells = []
        for _, key, spec in columns:
            value = r.get(key)
            cells.append(_pct(value) if spec == "%" else _fmt(value, spec))
        body.append("| " + " | ".join(cells) + " |")
    return "\n".join([head, rule, *body])


class Report:
    def __init__(self, out: Path, requests: int | None, jobs: int, seed: int):
        self.out, self.requests, self.jobs, self.seed = out, requests, jobs, seed
        self.traces = set(bundled_trace_names())
        self.sections: list[str] = []
        self.figures = out / "report"
        self.work = Path(tempfile.mkdtemp(prefix="leap-report-"))

    def predictors(self, wanted) -> list[str]:
        return [p for p in wanted if p in PREDICTORS]

    def runnable(self, trace: str, predictor: str) -> bool:
        if predictor == NO_PREDICTOR:
            return True
        needs = PREDICTORS[predictor].requires
        t = load_trace(trace)
        return all(t.has_feature(c) for c in needs)

    def run(self, configs: list[RunConfig], name: str, metrics=("mean_ptl_s",)) -> list[dict]:
        """Runs go to a scratch folder; only the results table is kept beside the report."""
        summaries = run_many(configs, out=self.work / name, jobs=self.jobs)
        for metric in metrics:
            add_relative_changes(summaries, metric)
        write_results(self.figures / name, summaries)
        return summaries

    def config(self, trace, predictor, policy, load, *, cost=True, arrivals=ArrivalSpec(), refresh=None,
               train="lmsys") -> RunConfig:
        return RunConfig(trace=trace, predictor=predictor, policy=policy, load=load, arrivals=arrivals,
                         requests=self._n(trace), seed=self.seed, charge_cost=cost,
                         predictor_options=PredictorOptions(train_trace=train, seed=self.seed,
                                                            charge_cost=cost, refresh=refresh))

    def _n(self, trace):
        if self.requests is None:
            return None
        return min(self.requests, len(load_trace(trace)))

    # ------------------------------------------------------------------ sections
    def serving_trace(self) -> str:
        return "sharegpt" if "sharegpt" in self.traces else "sharegpt-lengths"

    def table3(self, load: float) -> None:
        trace = self.serving_trace()
        preds = [p for p in ["leap", "leap-rls", *BASELINES, "oracle"] if p in PREDICTORS and self.runnable(trace, p)]
        configs = [self.config(trace, NO_PREDICTOR, "fcfs", load)] + [
            self.config(trace, p, "countdown", load) for p in preds]
        rows = self.run(configs, "table3")
        self.sections.append(
            f"## Table 3 analogue: every predictor, prediction cost charged\n\n"
            f"Trace `{trace}`, {rows[0]['arrived']} requests, Poisson arrivals at {load:g}x the FCFS capacity "
            f"({rows[0]['capacity_req_s']:.3f} req/s), policy countdown for every predictor, wait cap 128, "
            f"engine `{rows[0]['engine']}`.\n\n"
            + markdown_table(rows, [("predictor", "predictor", ""), ("policy", "policy", ""),
                                    ("mean PTL s", "mean_ptl_s", ".4f"), ("vs FCFS", "vs_fcfs_mean_ptl_s", "%"),
                                    ("vs LEAP", "vs_leap_mean_ptl_s", "%"), ("mean e2e s", "mean_e2e_s", ".2f"),
                                    ("p95 e2e s", "p95_e2e_s", ".2f"), ("mean TTFT s", "mean_ttft_s", ".3f"),
                                    ("tok/s", "throughput_tok_s", ".0f"), ("GPU s charged", "gpu_s_charged", ".2f"),
                                    ("Spearman", "spearman", ".3f"), ("Kendall", "kendall_tau", ".3f")])
            + f"\n\n{PAPER_TABLE3}\n")

    def table4(self, load: float) -> None:
        domains = [t for t in ("alpaca", "math", "multilingual") if t in self.traces]
        if "lmsys" not in self.traces or not domains:
            self.sections.append("## Table 4 analogue\n\nSkipped: needs the recorded `lmsys` trace and at least one "
                                 "of `alpaca`, `math`, `multilingual` in traces/.\n")
            return
        blocks = []
        for trace in domains:
            preds = [p for p in ["tie", "leap", "leap-rls", "ssjf", "ltr", "trail", "egtp"]
                     if p in PREDICTORS and self.runnable(trace, p)]
            configs = [self.config(trace, NO_PREDICTOR, "fcfs", load, cost=False)] + [
                self.config(trace, p, "aging", load, cost=False) for p in preds]
            rows = self.run(configs, f"table4-{trace}", metrics=("mean_ptl_s", "mean_e2e_s"))
            blocks.append(f"### `{trace}` ({rows[0]['arrived']} requests)\n\n" + markdown_table(
                rows, [("predictor", "predictor", ""), ("policy", "policy", ""),
                       ("mean e2e s", "mean_e2e_s", ".2f"), ("e2e vs FCFS", "vs_fcfs_mean_e2e_s", "%"),
                       ("e2e vs LEAP", "vs_leap_mean_e2e_s", "%"),
                       ("p95 e2e s", "p95_e2e_s", ".2f"), ("mean PTL s", "mean_ptl_s", ".4f"),
                       ("PTL vs FCFS", "vs_fcfs_mean_ptl_s", "%"),
                       ("Spearman", "spearman", ".3f"), ("Kendall", "kendall_tau", ".3f"),
                       ("RLS updates", "updates_published", "")]))
        self.sections.append(
            f"## Table 4 analogue: domain shift at {load:g}x, no prediction cost, exponential aging for all\n\n"
            "Learned predictors are trained on `lmsys` only. `vs LEAP` compares with the frozen read-out "
            "(the paper's frozen LEAP -> LEAP+RLS step).\n\n"
            + "\n\n".join(blocks) + f"\n\n{PAPER_TABLE4}\n")

    def quality_by_domain(self) -> None:
        """Spearman of each predictor per domain (trained on lmsys): the shift behind Table 4."""
        from predictors.evaluate import evaluate

        names = [t for t in ("sharegpt", "alpaca", "math", "multilingual") if t in self.traces]
        if "lmsys" not in self.traces or not names:
            self.sections.append("## Prediction quality by domain\n\nSkipped: needs `lmsys` and a served trace.\n")
            return
        traces = [load_trace(t) if self._n(t) is None else load_trace(t).take(np.arange(self._n(t)))
                  for t in names]
        preds = [p for p in ["leap", "leap-rls", *BASELINES] if p in PREDICTORS
                 and all(self.runnable(t, p) for t in names)]
        rows = evaluate(preds, traces, PredictorOptions(train_trace="lmsys", seed=self.seed))
        table: dict[tuple, dict] = {}
        for r in rows:
            row = table.setdefault((r["trace"], r["domain"]), {"trace": f"`{r['trace']}`", "domain": r["domain"],
                                                               "n": r["n"]})
            row[r["predictor"]] = r["spearman"]
        self.sections.append(
            "## Prediction quality by domain (Spearman, trained on `lmsys`)\n\n"
            "Each request is predicted before its own length is fed back (leap-rls streams the trace in "
            "order, publishing every 8 requests). `-`: the predictor gave one value for the whole domain "
            "(no rank order).\n\n"
            + markdown_table(list(table.values()), [("trace", "trace", ""), ("domain", "domain", ""),
                                                    ("n", "n", "")] + [(p, p, ".3f") for p in preds]) + "\n")

    def table2(self, load: float) -> None:
        trace = self.serving_trace()
        preds = [p for p in ("trail", "leap") if p in PREDICTORS and self.runnable(trace, p)]
        t = load_trace(trace)
        if not preds or t.decode_path is None:
            self.sections.append("## Table 2 analogue\n\nSkipped: needs a serving trace with a decode side table and "
                                 "the `leap`/`trail` predictors.\n")
            return
        configs = [self.config(trace, p, "countdown", load, refresh=r) for p in preds for r in (False, True)]
        rows = self.run(configs, "table2")
        for row, cfg in zip(rows, configs):
            row["refresh"] = "yes" if cfg.predictor_options.refresh else "no"
        self.sections.append(
            f"## Table 2 analogue: decode-time refresh, cost charged, `{trace}` at {load:g}x\n\n"
            + markdown_table(rows, [("predictor", "predictor", ""), ("refresh", "refresh", ""),
                                    ("mean e2e s", "mean_e2e_s", ".2f"), ("mean PTL s", "mean_ptl_s", ".4f"),
                                    ("p95 e2e s", "p95_e2e_s", ".2f"), ("MAE at arrival", "mae", ".1f"),
                                    ("MAE in use", "mae_in_use", ".1f"),
                                    ("GPU s charged", "gpu_s_charged", ".2f")])
            + "\n\n`MAE in use`: error of the length estimate each decoded token was scheduled on "
              "(per decoded token, refreshed estimates included); `MAE at arrival`: the first estimate.\n"
            + f"\n{PAPER_TABLE2}\n")

    def load_sweep(self, loads) -> None:
        from simulator.plots import write_plots

        trace = self.serving_trace()
        preds = [p for p in ["leap", "leap-rls", *BASELINES, "oracle"] if p in PREDICTORS and self.runnable(trace, p)]
        configs = [self.config(trace, p, "fcfs" if p == NO_PREDICTOR else "countdown", load)
                   for load in loads for p in [NO_PREDICTOR, *preds]]
        rows = self.run(configs, "load-sweep")
        pngs = write_plots(rows, self.figures / "load-sweep",
                           [self.work / "load-sweep" / run_slug(c) for c in configs])
        rel = [p.relative_to(self.out) for p in pngs]
        self.sections.append(
            f"## Fig. 6 analogue: load sweep on `{trace}`\n\n"
            + "\n".join(f"![{p.stem}]({p.as_posix()})" for p in rel) + "\n\n"
            + markdown_table(rows, [("predictor", "predictor", ""), ("load", "load", "g"),
                                    ("mean PTL s", "mean_ptl_s", ".4f"), ("vs FCFS", "vs_fcfs_mean_ptl_s", "%"),
                                    ("p95 e2e s", "p95_e2e_s", ".2f"),
                                    ("long-decile p95 s", "long_decile_p95_e2e_s", ".2f")]) + "\n")

    def azure(self, load: float) -> None:
        try:
            azure_csv = data_dir() / AZURE_CONV
        except DataDirMissing:
            azure_csv = None
        if azure_csv is None or not azure_csv.is_file():
            self.sections.append(f"## Azure 2023 arrivals\n\nSkipped: {AZURE_CONV.as_posix()} not found in the "
                                 f"shared data folder (${DATA_DIR_ENV} or ../shared/data).\n")
            return
        trace = self.serving_trace()
        preds = [p for p in ["leap", "leap-rls", "oracle"] if p in PREDICTORS and self.runnable(trace, p)]
        arrivals = ArrivalSpec("csv", azure_csv)
        configs = [self.config(trace, NO_PREDICTOR, "fcfs", load, arrivals=arrivals)] + [
            self.config(trace, p, "countdown", load, arrivals=arrivals) for p in preds]
        rows = self.run(configs, "azure")
        self.sections.append(
            f"## Arrivals replayed from the Azure 2023 conversation trace, `{trace}` at {load:g}x\n\n"
            "Real inter-arrival times (bursty) stretched to the load's mean rate.\n\n"
            + markdown_table(rows, [("predictor", "predictor", ""), ("mean PTL s", "mean_ptl_s", ".4f"),
                                    ("vs FCFS", "vs_fcfs_mean_ptl_s", "%"), ("mean e2e s", "mean_e2e_s", ".2f"),
                                    ("p95 e2e s", "p95_e2e_s", ".2f"), ("mean TTFT s", "mean_ttft_s", ".3f")]) + "\n")

    def traces_section(self) -> str:
        """Which bundled traces fed the report, so partial recordings are visible beside the figures."""
        rows = []
        for name in sorted(self.traces):
            t = load_trace(name)
            meta = t.metadata
            planned = meta.get("planned_requests")
            rows.append({"trace": f"`{name}`", "requests": len(t),
                         "status": "complete" if t.complete else f"partial ({len(t)} of {planned} recorded)",
                         "model": meta.get("model_id", ""), "backend": meta.get("backend", ""),
                         "used": "" if self.requests is None else f"first {min(self.requests, len(t))}"})
        columns = [("trace", "trace", ""), ("requests", "requests", ""), ("status", "status", ""),
                   ("model", "model", ""), ("backend", "backend", "")]
        if self.requests is not None:
            columns.append(("used here", "used", ""))
        return "## Traces\n\n" + markdown_table(rows, columns) + "\n"

    def write(self, command: str) -> Path:
        header = (f"# LEAP scheduling report on the bundled traces\n\nGenerated by `{command}` "
                  f"(seed {self.seed}). Every number below was measured by that command; "
                  "the results table of each experiment (one row per run, all summary fields) is in "
                  "`report/<experiment>/results.csv`.\n")
        path = self.out / "report.md"
        atomic_write_bytes(path, ("\n".join([header, self.traces_section(), *self.sections])).encode())
        return path


def _loads(flag: str, text: str) -> list[float]:
    try:
        return [parse_load(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"{flag} {text!r}: expected positive multiples of capacity such as 0.5,1,1.5x") from None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="leap-report", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs")
    ap.add_argument("--requests", type=int, default=None, help="first N requests of each trace (CI: small)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--loads", default="0.5,1,1.5,2", help="load sweep multiples")
    ap.add_argument("--table3-load", default="1", help="load of the Table 3 and Table 2 analogues")
    args = ap.parse_args(argv)
    report = None
    try:
        loads = _loads("--loads", args.loads)
        table3_load = _loads("--table3-load", args.table3_load)
        if len(table3_load) != 1:
            raise ValueError(f"--table3-load {args.table3_load!r}: one load, such as 1 or 1.5x")
        table3_load = table3_load[0]
        if args.requests is not None and args.requests < 2:
            raise ValueError("--requests must be >= 2")
        if args.jobs < 1:
            raise ValueError("--jobs must be >= 1")
        started = time.time()
        report = Report(args.out, args.requests, args.jobs, args.seed)
        report.table3(table3_load)
        report.table4(1.5)
        report.quality_by_domain()
        report.table2(table3_load)
        report.load_sweep(loads)
        report.azure(1.0)
        command = "leap-report" + (f" --requests {args.requests}" if args.requests else "")
        path = report.write(command)
    except BrokenPipeError:   # a closed output pipe: simulator.entry ends quietly
        raise
    except (TraceError, ValueError, OSError) as exc:
        print(f"leap-report: error: {exc}", file=sys.stderr)
        return 2
    finally:
        if report is not None:
            shutil.rmtree(report.work, ignore_errors=True)
    print(f"wrote {path} in {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
