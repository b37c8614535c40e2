"""``leap-report``: the paper's experiments on the bundled traces, as one Markdown report.

Sections (each skipped with a note when its traces or predictors are not available):
- Table 3 analogue: every predictor, prediction cost charged, serving trace, one load;
- Table 4 analogue: train on lmsys, serve alpaca / math / multilingual at 1.5x, no prediction
  cost, the same waiting protection (TIE's exponential aging) for every method;
- prediction quality (Spearman) per predictor and domain, trained on lmsys;
- Table 2 analogue: TRAIL and LEAP with and without decode-time refresh;
- Fig. 6 analogue: load sweep with plots;
- arrivals replayed from the Azure 2023 conversation trace;
- live serving runs (traces/live/): measured vs simulated, and the live Table 3 analogue with the
  simulated gain over FCFS beside the measured one ("no serving runs" when there are none).

    leap-report                                  # full sizes -> docs/report.md + docs/report/*.png
    leap-report --requests 300 --out /tmp/rep    # reduced sizes (CI)

Every flag, dependency (matplotlib) and input (traces, the Azure arrivals file, predictor artifacts,
which need torch when none matches) is checked before the first run; the report is written to a
temporary folder inside --out and replaces report.md and report/ only when complete, so a failure
or Ctrl-C leaves the previous report as it was. Progress goes to stderr, one line per run.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from core.arrivals import parse_load
from core.checks import MAX_NUMPY_SEED, bounded_int, output_path
from core.errors import OneLineParser, run_command
from core.io import DATA_DIR_ENV, DataDirMissing, atomic_write_bytes, data_dir
from core.trace import TraceError, bundled_trace_names, load_trace
from experiments.report_output import Progress, check_out, move_into_place
from experiments.serving_render import check_serving_runs, live_report_section
from experiments.sweep import (
    Stopped,
    SweepInterrupted,
    add_relative_changes,
    run_many,
    run_slug,
    sigterm_raises_stopped,
    write_results,
)
from predictors import LEARNED, PREDICTORS
from predictors.base import PredictorOptions
from simulator.runner import NO_PREDICTOR, RunConfig, prepare
from simulator.workload import ArrivalSpec

ROOT = Path(__file__).resolve().parent.parent
AZURE_CONV = Path("arrivals") / "AzureLLMInferenceTrace_conv.csv"     # under the shared data folder
PAPER_TABLE3 = ("Paper (real engine, ShareGPT 2.65 req/s, cost included): LEAP's mean PTL (NL here) is 15.9% below "
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


@dataclass
class Experiment:
    """Runs whose results table is kept as ``report/<name>/results.{parquet,csv}``."""

    name: str
    configs: list[RunConfig]
    metrics: tuple[str, ...] = ("mean_ptl_s",)


@dataclass
class Section:
    """One part of the report: its runs (planned and checked before anything runs) and its text."""

    title: str
    experiments: list[Experiment] = field(default_factory=list)
    render: Callable[[dict[str, list[dict]]], str] = lambda rows: ""   # rows by experiment -> Markdown
    #: a skipped section: why, and the experiments it would have written, whose results tables the
    #: previous report keeps (a missing input never deletes a committed result)
    skipped: str = ""
    keeps: tuple[str, ...] = ()


class Report:
    """Plans every section, checks every input, then runs into ``stage`` (moved into place by main)."""

    def __init__(self, requests: int | None, jobs: int, seed: int):
        self.requests, self.jobs, self.seed = requests, jobs, seed
        self.traces = set(bundled_trace_names())
        self.stage = self.work = Path()   # set by execute

    @property
    def figures(self) -> Path:
        return self.stage / "report"

    def predictors(self, wanted) -> list[str]:
        return [p for p in wanted if p in PREDICTORS]

    def runnable(self, trace: str, predictor: str) -> bool:
        if predictor == NO_PREDICTOR:
            return True
        needs = PREDICTORS[predictor].requires
        t = load_trace(trace)
        return all(t.has_feature(c) for c in needs)

    def config(self, trace, predictor, policy, load, *, cost=True, arrivals=ArrivalSpec(), refresh=None,
               train="lmsys") -> RunConfig:
        return RunConfig(trace=trace, predictor=predictor, policy=policy, load=load, arrivals=arrivals,
                         requests=self._n(trace), seed=self.seed, charge_cost=cost,
                         predictor_options=PredictorOptions(train_trace=train, seed=self.seed, refresh=refresh))

    def _n(self, trace):
        if self.requests is None:
            return None
        return min(self.requests, len(load_trace(trace)))

    # ------------------------------------------------------------------ plan, check, run
    def plan(self, loads, table3_load: float) -> list[Section]:
        return [self.table3(table3_load), self.table4(1.5), self.quality_by_domain(), self.table2(table3_load),
                self.load_sweep(loads), self.azure(1.0), self.live_serving()]

    def check(self, sections: list[Section]) -> None:
        """Every input of every run (traces, arrival files, predictor artifacts, which may need torch)
        loaded and validated now, so that a missing piece fails in seconds, not after the runs."""
        from experiments.plots import _pyplot

        _pyplot()
        for name in sorted(self.traces):
            load_trace(name)
        check_serving_runs()   # traces/live/: sources present and unchanged, a profile run for each
        seen = set()
        for section in sections:
            for experiment in section.experiments:
                for config in experiment.configs:
                    # the load and policy change neither the inputs nor the predictor's artifact
                    key = repr(dataclasses.replace(config, load=1.0, policy="fcfs"))
                    if key not in seen:
                        seen.add(key)
                        prepare(config)

    def execute(self, sections: list[Section], stage: Path, work: Path, progress: Progress,
                previous: Path | None = None) -> list[str]:
        """Runs go to ``work`` (scratch); results tables, figures and the report to ``stage``. A
        skipped section's results tables are carried over from ``previous`` (the old report/)."""
        self.stage, self.work = stage, work
        self.figures.mkdir(parents=True, exist_ok=True)
        texts = []
        for section in sections:
            if section.skipped:
                progress.note(self.keep_skipped(section, previous))
            rows = {}
            for experiment in section.experiments:
                n = len(experiment.configs)
                finished = iter(range(1, n + 1))
                rows[experiment.name] = self.run(   # on_done runs within this call: bound now anyway
                    experiment, on_done=lambda name=experiment.name, finished=finished, n=n:
                    progress.run_finished(name, next(finished), n))
            if not section.experiments and section.title:
                progress.say(section.title)
            texts.append(section.render(rows))
        return texts

    def keep_skipped(self, section: Section, previous: Path | None) -> str:
        """Copies the skipped section's tables from the previous report; the console line saying so."""
        kept = []
        for name in section.keeps:
            source = previous / name if previous is not None else None
            if source is not None and source.is_dir():
                shutil.copytree(source, self.figures / name)
                kept.append(f"report/{name}/")
        held = f"kept {', '.join(kept)} from the previous report" if kept else "no previous results to keep"
        return f"{section.skipped}; {held}"

    def run(self, experiment: Experiment, on_done) -> list[dict]:
        """Runs go to a scratch folder; only the results table is kept beside the report."""
        summaries = run_many(experiment.configs, out=self.work / experiment.name, jobs=self.jobs,
                             on_done=on_done, resume=False)
        for metric in experiment.metrics:
            add_relative_changes(summaries, metric)
        write_results(self.figures / experiment.name, summaries)
        return summaries

    # ------------------------------------------------------------------ sections
    def serving_trace(self) -> str:
        return "sharegpt" if "sharegpt" in self.traces else "sharegpt-lengths"

    def table3(self, load: float) -> Section:
        trace = self.serving_trace()
        preds = [p for p in [*LEARNED, "oracle"] if self.runnable(trace, p)]
        configs = [self.config(trace, NO_PREDICTOR, "fcfs", load)] + [
            self.config(trace, p, "countdown", load) for p in preds]

        def render(results):
            rows = results["table3"]
            return (
                f"## Table 3 analogue: every predictor, prediction cost charged\n\n"
                f"Trace `{trace}`, {rows[0]['arrived']} requests, Poisson arrivals at {load:g}x the FCFS capacity "
                f"({rows[0]['capacity_req_s']:.3f} req/s), policy countdown for every predictor, wait cap 128, "
                f"engine `{rows[0]['engine']}`.\n\n"
                + markdown_table(rows, [("predictor", "predictor", ""), ("policy", "policy", ""),
                                        ("mean NL s", "mean_ptl_s", ".4f"), ("vs FCFS", "vs_fcfs_mean_ptl_s", "%"),
                                        ("vs LEAP", "vs_leap_mean_ptl_s", "%"), ("p99 TPOT ms", "p99_tpot_ms", ".0f"),
                                        ("mean e2e s", "mean_e2e_s", ".2f"),
                                        ("p95 e2e s", "p95_e2e_s", ".2f"), ("mean TTFT s", "mean_ttft_s", ".3f"),
                                        ("tok/s", "throughput_tok_s", ".0f"),
                                        ("GPU s charged", "gpu_s_charged", ".2f"),
                                        ("Spearman", "spearman", ".3f"), ("Kendall", "kendall_tau", ".3f")])
                + f"\n\n{PAPER_TABLE3}\n")
        return Section("table3", [Experiment("table3", configs)], render)

    def table4(self, load: float) -> Section:
        domains = [t for t in ("alpaca", "math", "multilingual") if t in self.traces]
        if "lmsys" not in self.traces or not domains:
            return Section("", skipped="Table 4 analogue skipped: needs lmsys and a served trace",
                           keeps=tuple(f"table4-{t}" for t in ("alpaca", "math", "multilingual")), render=lambda rows: (
                "## Table 4 analogue\n\nSkipped: needs the recorded `lmsys` trace and at least one "
                "of `alpaca`, `math`, `multilingual` in traces/.\n"))
        experiments = []
        for trace in domains:
            preds = [p for p in LEARNED if self.runnable(trace, p)]
            configs = [self.config(trace, NO_PREDICTOR, "fcfs", load, cost=False)] + [
                self.config(trace, p, "aging", load, cost=False) for p in preds]
            experiments.append(Experiment(f"table4-{trace}", configs, metrics=("mean_ptl_s", "mean_e2e_s")))

        def render(results):
            blocks = []
            for trace in domains:
                rows = results[f"table4-{trace}"]
                blocks.append(f"### `{trace}` ({rows[0]['arrived']} requests)\n\n" + markdown_table(
                    rows, [("predictor", "predictor", ""), ("policy", "policy", ""),
                           ("mean e2e s", "mean_e2e_s", ".2f"), ("e2e vs FCFS", "vs_fcfs_mean_e2e_s", "%"),
                           ("e2e vs LEAP", "vs_leap_mean_e2e_s", "%"),
                           ("p95 e2e s", "p95_e2e_s", ".2f"), ("mean NL s", "mean_ptl_s", ".4f"),
                           ("NL vs FCFS", "vs_fcfs_mean_ptl_s", "%"),
                           ("Spearman", "spearman", ".3f"), ("Kendall", "kendall_tau", ".3f"),
                           ("RLS updates", "updates_published", "")]))
            return (f"## Table 4 analogue: domain shift at {load:g}x, no prediction cost, exponential aging for all\n\n"
                    "Learned predictors are trained on `lmsys` only. `vs LEAP` compares with the frozen read-out "
                    "(the paper's frozen LEAP -> LEAP+RLS step).\n\n"
                    + "\n\n".join(blocks) + f"\n\n{PAPER_TABLE4}\n")
        return Section("table4", experiments, render)

    def quality_by_domain(self) -> Section:
        """Spearman of each predictor per domain (trained on lmsys): the shift behind Table 4."""
        names = [t for t in ("sharegpt", "alpaca", "math", "multilingual") if t in self.traces]
        if "lmsys" not in self.traces or not names:
            return Section("", render=lambda rows: (
                "## Prediction quality by domain\n\nSkipped: needs `lmsys` and a served trace.\n"))
        preds = [p for p in LEARNED if all(self.runnable(t, p) for t in names)]

        def render(results):
            from predictors.evaluate import evaluate

            traces = [load_trace(t) if self._n(t) is None else load_trace(t).take(np.arange(self._n(t)))
                      for t in names]
            rows = evaluate(preds, traces, PredictorOptions(train_trace="lmsys", seed=self.seed))
            table: dict[tuple, dict] = {}
            for r in rows:
                row = table.setdefault((r["trace"], r["domain"]), {"trace": f"`{r['trace']}`",
                                                                   "domain": r["domain"], "n": r["n"]})
                row[r["predictor"]] = r["spearman"]
            return (
                "## Prediction quality by domain (Spearman, trained on `lmsys`)\n\n"
                "Each request is predicted before its own length is fed back (leap-rls streams the trace in "
                "order, publishing every 8 requests). `-`: the predictor gave one value for the whole domain "
                "(no rank order).\n\n"
                + markdown_table(list(table.values()), [("trace", "trace", ""), ("domain", "domain", ""),
                                                        ("n", "n", "")] + [(p, p, ".3f") for p in preds]) + "\n")
        # the same predictors, trained on lmsys, serve these traces in table 3/4 runs: checked there
        return Section("prediction quality by domain", render=render)

    def table2(self, load: float) -> Section:
        trace = self.serving_trace()
        preds = [p for p in ("trail", "leap") if p in PREDICTORS and self.runnable(trace, p)]
        t = load_trace(trace)
        if not preds or t.decode_path is None:
            return Section("", skipped="Table 2 analogue skipped: needs a decode side table and leap/trail",
                           keeps=("table2",), render=lambda rows: (
                "## Table 2 analogue\n\nSkipped: needs a serving trace with a decode side table and "
                "the `leap`/`trail` predictors.\n"))
        configs = [self.config(trace, p, "countdown", load, refresh=r) for p in preds for r in (False, True)]

        def render(results):
            rows = results["table2"]
            for row, cfg in zip(rows, configs):
                row["refresh"] = "yes" if cfg.predictor_options.refresh else "no"
            return (
                f"## Table 2 analogue: decode-time refresh, cost charged, `{trace}` at {load:g}x\n\n"
                + markdown_table(rows, [("predictor", "predictor", ""), ("refresh", "refresh", ""),
                                        ("mean e2e s", "mean_e2e_s", ".2f"), ("mean NL s", "mean_ptl_s", ".4f"),
                                        ("p95 e2e s", "p95_e2e_s", ".2f"), ("MAE at arrival", "mae", ".1f"),
                                        ("MAE in use", "mae_in_use", ".1f"),
                                        ("GPU s charged", "gpu_s_charged", ".2f")])
                + "\n\n`MAE in use`: error of the length estimate each decoded token was scheduled on "
                  "(per decoded token, refreshed estimates included); `MAE at arrival`: the first estimate.\n"
                + f"\n{PAPER_TABLE2}\n")
        return Section("table2", [Experiment("table2", configs)], render)

    def load_sweep(self, loads) -> Section:
        trace = self.serving_trace()
        preds = [p for p in [*LEARNED, "oracle"] if self.runnable(trace, p)]
        configs = [self.config(trace, p, "fcfs" if p == NO_PREDICTOR else "countdown", load)
                   for load in loads for p in [NO_PREDICTOR, *preds]]

        def render(results):
            from experiments.plots import write_plots

            rows = results["load-sweep"]
            pngs = write_plots(rows, self.figures / "load-sweep",
                               [self.work / "load-sweep" / run_slug(c) for c in configs])
            rel = [p.relative_to(self.stage) for p in pngs]
            return (
                f"## Fig. 6 analogue: load sweep on `{trace}`\n\n"
                + "\n".join(f"![{p.stem}]({p.as_posix()})" for p in rel) + "\n\n"
                + markdown_table(rows, [("predictor", "predictor", ""), ("load", "load", "g"),
                                        ("mean NL s", "mean_ptl_s", ".4f"), ("vs FCFS", "vs_fcfs_mean_ptl_s", "%"),
                                        ("p99 TPOT ms", "p99_tpot_ms", ".0f"), ("p95 e2e s", "p95_e2e_s", ".2f"),
                                        ("long-decile p95 s", "long_decile_p95_e2e_s", ".2f")]) + "\n")
        return Section("load-sweep", [Experiment("load-sweep", configs)], render)

    def azure(self, load: float) -> Section:
        try:
            azure_csv = data_dir() / AZURE_CONV
        except DataDirMissing:
            azure_csv = None
        if azure_csv is None or not azure_csv.is_file():
            note = (f"## Azure 2023 arrivals\n\nSkipped: {AZURE_CONV.as_posix()} not found in the "
                    f"shared data folder (${DATA_DIR_ENV} or ../shared/data).\n")
            return Section("", skipped=f"Azure section skipped: {AZURE_CONV.as_posix()} not found", keeps=("azure",),
                           render=lambda rows: note)
        trace = self.serving_trace()
        preds = [p for p in ["leap", "leap-rls", "oracle"] if p in PREDICTORS and self.runnable(trace, p)]
        arrivals = ArrivalSpec("csv", azure_csv)
        configs = [self.config(trace, NO_PREDICTOR, "fcfs", load, arrivals=arrivals)] + [
            self.config(trace, p, "countdown", load, arrivals=arrivals) for p in preds]

        def render(results):
            return (
                f"## Arrivals replayed from the Azure 2023 conversation trace, `{trace}` at {load:g}x\n\n"
                "Real inter-arrival times (bursty) stretched to the load's mean rate.\n\n"
                + markdown_table(results["azure"], [
                    ("predictor", "predictor", ""), ("mean NL s", "mean_ptl_s", ".4f"),
                    ("vs FCFS", "vs_fcfs_mean_ptl_s", "%"), ("p99 TPOT ms", "p99_tpot_ms", ".0f"),
                    ("mean e2e s", "mean_e2e_s", ".2f"),
                    ("p95 e2e s", "p95_e2e_s", ".2f"), ("mean TTFT s", "mean_ttft_s", ".3f")]) + "\n")
        return Section("azure", [Experiment("azure", configs)], render)

    def live_serving(self) -> Section:
        """Serving runs in traces/live/ (``leap-serve``) replayed by the simulator under a
        profile fitted on another run (experiments.validate): validation table and live Table 3
        analogue with simulated beside measured gains; a note when there are no serving runs."""
        return Section("live serving runs: measured vs simulated", render=lambda rows: live_report_section())

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

    def write(self, stage: Path, command: str, sections: list[str]) -> Path:
        header = (f"# LEAP scheduling report on the bundled traces\n\nGenerated by `{command}` "
                  f"(seed {self.seed}). Every number below was measured by that command; "
                  "the results table of each experiment (one row per run, all summary fields) is in "
                  "`report/<experiment>/results.csv`.\n")
        path = stage / "report.md"
        atomic_write_bytes(path, ("\n".join([header, self.traces_section(), *sections])).encode())
        return path


def _loads(flag: str, text: str) -> list[float]:
    try:
        return [parse_load(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"{flag} {text!r}: expected positive multiples of capacity such as 0.5,1,1.5x") from None


def main(argv=None) -> int:
    """``leap-report``: bad input is one line and exit 2 (``core.errors``); output is replaced only
    when the whole report is written."""
    return run_command(_report, argv, "leap-report", input_errors=(TraceError, ValueError, OSError))


def _report(argv: list[str]) -> int:
    ap = OneLineParser(prog="leap-report", description=__doc__.splitlines()[0].replace("``", ""))
    ap.add_argument("--out", type=output_path, default=ROOT / "docs", help="folder for report.md and report/ (default docs/)")
    ap.add_argument("--requests", type=int, default=None, help="first N requests of each trace (CI: small)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes (default: CPU count)")
    ap.add_argument("--seed", type=bounded_int(0, MAX_NUMPY_SEED), default=0, help="seed of every run (default 0)")
    ap.add_argument("--loads", default="0.5,1,1.5,2", help="load sweep multiples (default 0.5,1,1.5,2)")
    ap.add_argument("--table3-load", default="1", help="load of the Table 3 and Table 2 analogues (default 1)")
    args = ap.parse_args(argv)
    started = time.monotonic()
    made_out, stage, work, progress = False, None, None, None
    try:
        with sigterm_raises_stopped():
            loads = _loads("--loads", args.loads)
            table3_loads = _loads("--table3-load", args.table3_load)
            if len(table3_loads) != 1:
                raise ValueError(f"--table3-load {args.table3_load!r}: one load, such as 1 or 1.5x")
            table3_load = table3_loads[0]
            if args.requests is not None and args.requests < 2:
                raise ValueError("--requests must be >= 2")
            if args.jobs < 1:
                raise ValueError("--jobs must be >= 1")
            check_out(args.out)
            report = Report(args.requests, args.jobs, args.seed)
            sections = report.plan(loads, table3_load)
            report.check(sections)   # every dependency and input, before any run or output
            made_out = not args.out.exists()
            args.out.mkdir(parents=True, exist_ok=True)
            stage = Path(tempfile.mkdtemp(prefix=".leap-report-", dir=args.out))
            work = Path(tempfile.mkdtemp(prefix="leap-report-"))
            progress = Progress(sum(len(e.configs) for s in sections for e in s.experiments))
            texts = report.execute(sections, stage, work, progress, previous=args.out / "report")
            command = "leap-report" + (f" --requests {args.requests}" if args.requests else "")
            report.write(stage, command, texts)
            move_into_place(stage, args.out)
    except BrokenPipeError:   # a closed output pipe: experiments.entry ends quietly
        raise
    except (TraceError, ValueError, OSError):
        _close(progress)
        raise   # one line, exit 2 (core.errors.run_command)
    except (KeyboardInterrupt, Stopped, SweepInterrupted) as exc:
        _close(progress)
        code = exc.exit_code if isinstance(exc, SweepInterrupted) else 128 + getattr(exc, "signum", signal.SIGINT)
        print(f"leap-report: interrupted; {args.out} left as it was", file=sys.stderr)
        return code
    finally:
        for folder in (stage, work):
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
        if made_out and args.out.is_dir() and not any(args.out.iterdir()):
            args.out.rmdir()
    _close(progress)
    print(f"wrote {args.out / 'report.md'} in {time.monotonic() - started:.0f} s")
    return 0


def _close(progress: Progress | None) -> None:
    if progress is not None:
        progress.close()


if __name__ == "__main__":
    sys.exit(main())
