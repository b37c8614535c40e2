"""``evaluate-predictors``: offline prediction quality of registered predictors on recorded traces.

For every predictor and every domain of every evaluation trace: n, Spearman, Kendall tau-b,
pairwise-order accuracy, MAE overall and by true length (<=256, 257-1024, >1024 tokens).

Predictors that learn online (``feedback`` overridden, e.g. ``leap-rls``) are streamed: requests in
trace order, each predicted from the currently published state BEFORE its own true length is fed
back, and every returned update published at once (offline evaluation has no CPU delay). Each
evaluation trace gets a freshly bound predictor, so online learning starts from the anchor per trace.
Other predictors score the whole trace in one call.

``--ablation target`` refits the frozen read-out with length, sqrt(length) and log(length) targets
(each with its own cross-validated lambda) and reports MAE by bucket (the paper's Table 6).
``--ablation layer`` fits one read-out per feature column (tapped layer) present in both the training
and the evaluation trace, plus one on their concatenation (the paper's Table 7); with only one
feature column, or no evaluation trace with one of them, it is refused (one line, exit 2).

Bad input (unknown predictor, missing trace, trace without the needed column) prints one line on
stderr and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterable

import numpy as np
import pyarrow as pa

from core.checks import MAX_NUMPY_SEED, bounded_int, split_list
from core.console import fitted_table, output_width, stdout_console
from core.errors import OneLineParser, UsageError, run_command
from core.metrics import bucket_counts, rank_metrics
from core.trace import Trace, TraceError, bundled_trace_names, load_trace, traces_dir
from predictors import PREDICTORS, make_predictor
from predictors.base import Known, Predictor, PredictorOptions

DEFAULT_PREDICTORS = ("leap", "leap-rls")
ABLATIONS = ("target", "layer")
METRIC_COLUMNS = (
    ("n", "n"), ("spearman", "Spearman"), ("kendall_tau", "Kendall tau"),
    ("pairwise_accuracy", "pair acc"), ("mae", "MAE"), ("mae_le256", "MAE <=256"),
    ("mae_257_1024", "MAE 257-1024"), ("mae_gt1024", "MAE >1024"),
)


def _split(flag: str, values: Iterable[str] | None) -> list[str]:
    """Every comma list given to a repeatable flag; an empty one (``--predictor ,``) is refused."""
    out: list[str] = []
    for value in values or ():
        out.extend(split_list(flag, value))
    return out


def stream_predictions(predictor: Predictor, workload: Trace, seed: int = 0) -> tuple[np.ndarray, int]:
    """Bind ``predictor`` to ``workload`` and return (first prediction per row, updates published).

    Online learners and queue-aware predictors see rows in trace order: predict row i (i arrived
    before it, i finished), then feed back its true length and publish any resulting update
    immediately. The predictor is bound without the true lengths unless it is an oracle.
    """
    shown = workload if predictor.sees_true_lengths else workload.without_lengths()
    predictor.bind(shown, np.random.default_rng(seed))
    n = len(workload)
    if not predictor.learns_online and not predictor.queue_aware:
        return np.asarray(predictor.predict(np.arange(n), Known(arrived=n, finished=0)), dtype=np.float64), 0
    truth = workload.output_tokens
    out = np.empty(n)
    published = 0
    for i in range(n):
        row = np.array([i])
        out[i] = float(np.asarray(predictor.predict(row, Known(arrived=i + 1, finished=i)), dtype=np.float64)[0])
        update = predictor.feedback(row, truth[i:i + 1])
        if update is not None:
            update.publish()
            published += 1
    return out, published


def _domains(trace: Trace) -> list[tuple[str, np.ndarray]]:
    domain = trace.domain
    names = list(dict.fromkeys(domain.tolist()))
    return [(str(name), np.flatnonzero(domain == name)) for name in names]


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, np.generic):
        return _clean(value.item())
    return value


def _quality(pred: np.ndarray, true: np.ndarray, *, lengths: bool = True) -> dict:
    m = rank_metrics(pred, true)
    counts = bucket_counts(true)
    m["n_le256"], m["n_257_1024"], m["n_gt1024"] = counts["<=256"], counts["257-1024"], counts[">1024"]
    if not lengths:            # a rank score has no token scale
        for key in ("mae", "mae_le256", "mae_257_1024", "mae_gt1024"):
            m[key] = math.nan
    return m


def evaluate(predictor_names: list[str], traces: list[Trace], options: PredictorOptions,
             train_hash: str | None = None) -> list[dict]:
    """One record per predictor x trace x domain."""
    rows: list[dict] = []
    for name in predictor_names:
        for trace in traces:
            predictor = make_predictor(name, options)
            pred, updates = stream_predictions(predictor, trace, options.seed)
            truth = trace.output_tokens.astype(np.float64)
            for domain, idx in _domains(trace):
                record: dict[str, object] = {"predictor": name, "trace": trace.name, "domain": domain}
                record.update(_quality(pred[idx], truth[idx], lengths=predictor.output == "length"))
                record["online_updates"] = updates
                record["in_sample"] = bool(train_hash is not None and trace.content_hash == train_hash)
                rows.append(record)
    return rows


def feature_columns(trace: Trace) -> list[str]:
    """Hidden-state vector columns (``feat*``) of a trace, in file order."""
    return [f.name for f in trace.table.schema
            if f.name.startswith("feat") and pa.types.is_fixed_size_list(f.type)]


def ablation_target(train: Trace, traces: list[Trace]) -> list[dict]:
    from core.readout import DEFAULT_COLUMN, TARGETS, fit_readout

    rows = []
    for target in TARGETS:
        readout, _ = fit_readout(train, DEFAULT_COLUMN, target)
        for trace in traces:
            if not trace.has_feature(DEFAULT_COLUMN):
                raise TraceError(f"trace {trace.name}: has no column {DEFAULT_COLUMN!r} (needed by LEAP)")
            pred = readout.predict(trace.feature(DEFAULT_COLUMN))
            truth = trace.output_tokens.astype(np.float64)
            for domain, idx in _domains(trace):
                record: dict[str, object] = {"ablation": "target", "target": target, "trace": trace.name,
                                             "domain": domain}
                record.update(_quality(pred[idx], truth[idx]))
                record["lambda"] = readout.lam
                rows.append(record)
    return rows


def check_layer_ablation(train: Trace, traces: list[Trace]) -> None:
    """``--ablation layer`` compares tapped layers: a training trace with fewer than two feature
    columns, or no evaluation trace with one of them, has nothing to compare (exit 2, one line)."""
    columns = feature_columns(train)
    if len(columns) < 2:
        raise UsageError(f"--ablation layer: training trace {train.name!r} has {len(columns)} feature column(s) "
                         f"({', '.join(columns) or 'none'}); it needs several tapped layers (capture-traces "
                         "--layer K --mean-layer K ...)")
    if not any(t.has_feature(c) for t in traces for c in columns):
        raise UsageError(f"--ablation layer: no evaluation trace ({', '.join(t.name for t in traces)}) has a "
                         f"feature column of training trace {train.name!r} ({', '.join(columns)})")


def ablation_layer(train: Trace, traces: list[Trace]) -> list[dict] | None:
    """None when the training trace has fewer than two feature columns."""
    from core.readout import fit_readout

    columns = feature_columns(train)
    if len(columns) < 2:
        return None
    rows = []
    # the Table 7 analogue concatenates the last-token layers when there are several, else everything
    last_token = [c for c in columns if c == "feat_last" or c.startswith("feat_last_")]
    concat = tuple(last_token if len(last_token) >= 2 else columns)
    variants: list[tuple[str, ...]] = [(c,) for c in columns] + [concat]
    for cols in variants:
        usable = [t for t in traces if all(t.has_feature(c) for c in cols)]
        if not usable:
            continue
        readout, _ = fit_readout(train, cols if len(cols) > 1 else cols[0])
        for trace in usable:
            X = np.hstack([trace.feature(c) for c in cols])
            if X.shape[1] != readout.d:
                raise TraceError(f"trace {trace.name}: feature width {X.shape[1]} differs from the "
                                 f"training trace's {readout.d} for {'+'.join(cols)}")
            pred = readout.predict(X)
            truth = trace.output_tokens.astype(np.float64)
            bytes_per_request = sum(trace.table.schema.field(c).type.list_size
                                    * trace.table.schema.field(c).type.value_type.bit_width // 8
                                    for c in cols)
            for domain, idx in _domains(trace):
                record = {"ablation": "layer", "columns": "+".join(cols),
                          "layers": [train.feature_layer(c) for c in cols],
                          "d": readout.d, "feature_bytes": int(bytes_per_request),
                          "trace": trace.name, "domain": domain}
                record.update(_quality(pred[idx], truth[idx]))
                record["lambda"] = readout.lam
                rows.append(record)
    return rows


def _fmt(value) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else ""
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, float):
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.3f}" if value == 0 or abs(value) >= 0.01 else f"{value:.3g}"
    if isinstance(value, list):
        return ",".join(_fmt(v) for v in value)
    return str(value)


#: Columns a narrow terminal loses first to last (``--wide`` keeps them all): the bucket MAEs and
#: the second and third rank metrics go before a row's identity, n, Spearman and MAE.
DROP_ORDER = ["online_updates", "mae_257_1024", "mae_le256", "mae_gt1024", "lambda", "feature_bytes", "d",
              "pairwise_accuracy", "kendall_tau"]
#: Width when stdout is neither a terminal nor told by $COLUMNS (a file, a pipe).
PIPED_WIDTH = 100


def _print_table(rows: list[dict], keys: list[tuple[str, str]], title: str, wide: bool = False) -> None:
    from rich.table import Table

    labels = dict(keys)

    def build(kept: list[str]) -> Table:
        table = Table()
        for key in kept:
            table.add_column(labels[key], justify="right" if key not in ("predictor", "trace", "domain", "target",
                                                                         "columns") else "left")
        for row in rows:
            table.add_row(*(_fmt(row.get(key)) for key in kept))
        return table

    width = output_width(PIPED_WIDTH)
    table, console_width, dropped = fitted_table(build, [k for k, _ in keys], DROP_ORDER, width, wide)
    console = stdout_console(console_width)
    # the title names trace paths of any length: wrapped at the terminal (--wide: never wrapped)
    console.print(title, style="italic", soft_wrap=wide, width=None if wide else width)
    console.print(table)
    if dropped:
        console.print(f"not shown at {width} columns: {', '.join(labels[k] for k in dropped)} (--wide shows "
                      "every column, --json every figure)", width=width)


def build_parser() -> OneLineParser:
    p = OneLineParser(prog="evaluate-predictors",
                      description="Prediction quality (rank metrics, MAE by bucket) of length "
                                  "predictors on recorded traces.")
    p.add_argument("--train-trace", default="lmsys",
                   help="training trace for learned predictors (bundled name or path; default lmsys)")
    p.add_argument("--trace", action="append", metavar="TRACE",
                   help="evaluation trace, bundled name or path (repeatable; default: every bundled trace)")
    p.add_argument("--predictor", action="append", metavar="NAME",
                   help=f"predictor(s), repeatable or comma list (default {','.join(DEFAULT_PREDICTORS)}; "
                        f"registered: {', '.join(PREDICTORS)})")
    p.add_argument("--ablation", choices=ABLATIONS,
                   help="target: length/sqrt/log targets (Table 6); layer: per feature column (Table 7)")
    p.add_argument("--update-every", type=int, default=8, help="online update batch (leap-rls; default 8)")
    p.add_argument("--seed", type=bounded_int(0, MAX_NUMPY_SEED, "what numpy and the results tables take"),
                   default=0, help="seed passed to predictors at bind (default 0)")
    p.add_argument("--json", action="store_true", help="one JSON object per line instead of a table")
    p.add_argument("--wide", action="store_true", help="every column, however wide (default: the table fits the "
                   "terminal, dropping the bucket MAEs and secondary rank metrics first, never cutting a value)")
    return p


def _emit(rows: list[dict], as_json: bool, keys: list[tuple[str, str]], title: str, wide: bool = False) -> None:
    if as_json:
        for row in rows:
            print(json.dumps({k: _clean(v) for k, v in row.items()}, allow_nan=False, sort_keys=False))
    else:
        _print_table(rows, keys, title, wide)


def run(args: argparse.Namespace) -> int:
    names = _split("--predictor", args.predictor) or list(DEFAULT_PREDICTORS)
    unknown = [n for n in names if n not in PREDICTORS]
    if unknown:
        raise ValueError(f"unknown predictor {unknown[0]!r} (choose from {', '.join(PREDICTORS)})")
    if args.trace:
        traces = [load_trace(spec) for spec in _split("--trace", args.trace)]
    else:                       # every bundled trace that has the columns the predictors need
        needed = {"feat_last"} if args.ablation else {c for n in names for c in PREDICTORS[n].requires}
        traces = []
        for spec in bundled_trace_names():
            trace = load_trace(spec)
            missing = sorted(c for c in needed if not trace.has_feature(c))
            if missing:
                print(f"evaluate-predictors: skipping bundled trace {spec!r} (no {', '.join(missing)})",
                      file=sys.stderr)
            else:
                traces.append(trace)
        if not traces:
            raise ValueError("no evaluation trace given (--trace) and no bundled trace in "
                             f"{traces_dir()} has the needed columns")
    options = PredictorOptions(train_trace=args.train_trace, update_every=args.update_every, seed=args.seed)

    if args.ablation:
        train = load_trace(args.train_trace)
        if args.ablation == "target":
            rows = ablation_target(train, traces)
            keys = [("target", "target"), ("trace", "trace"), ("domain", "domain"), ("n", "n"),
                    ("mae_le256", "MAE <=256"), ("mae_257_1024", "MAE 257-1024"),
                    ("mae_gt1024", "MAE >1024"), ("mae", "MAE"), ("spearman", "Spearman"),
                    ("lambda", "lambda")]
            _emit(rows, args.json, keys, f"target ablation (trained on {train.name})", args.wide)
            return 0
        check_layer_ablation(train, traces)   # refused before any read-out is fitted
        layer_rows = ablation_layer(train, traces)
        assert layer_rows, "check_layer_ablation passed: some variant has a usable trace"
        keys = [("columns", "columns"), ("layers", "layers"), ("d", "d"), ("feature_bytes", "bytes/req"),
                ("trace", "trace"), ("domain", "domain"), ("n", "n"), ("spearman", "Spearman"),
                ("mae", "MAE"), ("mae_le256", "MAE <=256"), ("mae_257_1024", "MAE 257-1024"),
                ("mae_gt1024", "MAE >1024")]
        _emit(layer_rows, args.json, keys, f"layer ablation (trained on {train.name})", args.wide)
        return 0

    train_hash = None
    if any(getattr(PREDICTORS[n], "requires", ()) for n in names) and args.train_trace:
        try:
            train_hash = load_trace(args.train_trace).content_hash
        except TraceError:
            train_hash = None      # only learned predictors need it; they report the error themselves
    rows = evaluate(names, traces, options, train_hash)
    keys = [("predictor", "predictor"), ("trace", "trace"), ("domain", "domain"), *METRIC_COLUMNS,
            ("online_updates", "updates"), ("in_sample", "in-sample")]
    _emit(rows, args.json, keys, f"prediction quality (training trace {args.train_trace})", args.wide)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``evaluate-predictors``: bad input is one line and exit 2 (``core.errors``)."""
    return run_command(lambda args: run(build_parser().parse_args(args)), argv, "evaluate-predictors",
                       input_errors=(TraceError, ValueError, OSError))


if __name__ == "__main__":
    sys.exit(main())
