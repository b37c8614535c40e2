"""Summaries of recorded traces (numpy + pyarrow only).

    capture-traces report traces/*.parquet
        per domain: requests, prompt/output token percentiles, share hitting the cap,
        and per trace the capture throughput (generated tokens / wall seconds of the runs).
    capture-traces signal --train traces/lmsys.parquet traces/*.parquet
        LEAP's read-out (core/readout.py) fitted on the training trace: out-of-fold 5-fold CV
        Spearman in-sample, Spearman of its prediction per domain on the other traces (side tables
        skipped).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from core.errors import OneLineParser
from core.metrics import spearman
from core.readout import fit_readout, out_of_fold_predictions
from core.trace import METADATA_KEY, SCHEMA_VERSION, Trace, TraceError, load_trace, trace_content_hash, validate_table

from . import CaptureError


def _load(path):
    import pyarrow.parquet as pq

    p = Path(path)
    if p.is_dir() and p.name.endswith(".parts"):  # a recording in progress (read-only peek)
        import pyarrow as pa

        from .store import dedupe_first

        files = sorted(p.glob("gen-*-*.parquet"))
        if not files:
            raise CaptureError(f"{p}: nothing recorded yet")
        t = dedupe_first(pa.concat_tables([pq.read_table(f) for f in files],
                                          promote_options="permissive"), ["request_id"])
        runs = []
        for f in sorted(p.glob("run-*.json")):
            try:
                runs.append(json.loads(f.read_text()))
            except (OSError, ValueError):
                pass
        return t, {"runs": runs}
    if not p.is_file():
        raise CaptureError(f"no such trace: {p}")
    try:
        t = pq.read_table(p)
    except Exception as e:  # noqa: BLE001
        raise CaptureError(f"cannot read {p}: {e}") from None
    raw = (t.schema.metadata or {}).get(METADATA_KEY)
    meta = json.loads(raw) if raw else {}
    return t, meta


def _pct(x, qs=(50, 90, 99)):
    return [float(np.percentile(x, q)) for q in qs] if len(x) else [float("nan")] * len(qs)


def report_rows(paths):
    rows = []
    for path in paths:
        t, meta = _load(path)
        if meta.get("table") in ("decode", "steps"):   # a side table (`traces/*.parquet` names them too)
            continue
        missing = [c for c in ("domain", "prompt_tokens", "output_tokens", "finish_reason", "max_tokens")
                   if c not in t.column_names]
        if missing:
            raise CaptureError(f"{path}: not a recorded trace (no column {', '.join(missing)})")
        dom = np.asarray(t.column("domain").to_pylist(), dtype=object)
        pt = t.column("prompt_tokens").to_numpy()
        ot = t.column("output_tokens").to_numpy()
        fr = np.asarray(t.column("finish_reason").to_pylist(), dtype=object)
        runs = meta.get("runs") or []
        gen = sum(r.get("generated_tokens", 0) for r in runs)
        wall = sum(r.get("wall_s", 0.0) for r in runs)
        tps = gen / wall if wall else float("nan")
        domains = sorted(set(dom.tolist()))
        for d in domains + (["(all)"] if len(domains) > 1 else []):
            m = dom == d if d != "(all)" else np.ones(len(dom), dtype=bool)
            rows.append({
                "trace": Path(path).name, "domain": d, "requests": int(m.sum()),
                "prompt_p50_p90_p99": _pct(pt[m]), "output_p50_p90_p99": _pct(ot[m]),
                "output_mean": float(ot[m].mean()), "cap_share": float(np.mean(fr[m] == "length")),
                "max_tokens": int(t.column("max_tokens").to_numpy().max()),
                "capture_gen_tok_s": tps,
            })
    return rows


def main(argv=None) -> int:
    p = OneLineParser(prog="capture-traces report")
    p.add_argument("traces", nargs="+")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    rows = report_rows(a.traces)
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    hdr = f"{'trace':<24}{'domain':<16}{'n':>6}  {'prompt p50/p90/p99':<20}{'output p50/p90/p99':<21}{'mean':>6}{'cap%':>6}{'tok/s':>8}"
    print(hdr)
    for r in rows:
        pp = "/".join(f"{x:.0f}" for x in r["prompt_p50_p90_p99"])
        oo = "/".join(f"{x:.0f}" for x in r["output_p50_p90_p99"])
        print(f"{r['trace']:<24}{r['domain']:<16}{r['requests']:>6}  {pp:<20}{oo:<21}"
              f"{r['output_mean']:>6.0f}{100 * r['cap_share']:>6.1f}{r['capture_gen_tok_s']:>8.1f}")
    return 0


# ------------------------------------------------------------------ signal check
# The read-out is the project's one (core/readout.py: standardise + ridge on sqrt(length), lambda
# by 5-fold CV on the training trace, clip, square) and so is the rank metric (core/metrics.py),
# so these figures are the ones `simulate --predictor leap` and `evaluate-predictors` report for
# the same traces.

SIDE_TABLE_SUFFIXES = (".steps.parquet", ".decode.parquet")


def _signal_trace(path):
    """A validated trace (file, or a ``.parts`` recording in progress); bad input -> CaptureError."""
    p = Path(path)
    try:
        if p.is_dir() and p.name.endswith(".parts"):
            t, _ = _load(p)
            meta = {"schema_version": SCHEMA_VERSION}
            validate_table(t, meta, p)
            return Trace(name=p.name[: -len(".parquet.parts")], path=None, table=t, metadata=meta,
                         content_hash=trace_content_hash(t, meta))
        return load_trace(p)
    except TraceError as e:
        raise CaptureError(str(e)) from None


def signal_rows(train_path, paths, column: str = "feat_last") -> tuple[dict, list[dict]]:
    """(training summary, one row per trace and domain) of LEAP's read-out trained on ``train_path``."""
    train = _signal_trace(train_path)
    if not train.has_feature(column):
        raise CaptureError(f"{train_path}: no column {column!r} to train on")
    try:
        readout, _ = fit_readout(train, column)
    except (TraceError, ValueError) as e:
        raise CaptureError(f"{train_path}: {e}") from None
    cv = spearman(out_of_fold_predictions(train, column), train.output_tokens) if len(train) >= 10 else float("nan")
    head = {"trace": Path(train_path).name, "column": column, "n": len(train), "alpha": readout.alpha,
            "lambda": readout.lam, "cv_spearman": cv}
    rows: list[dict] = []
    train_file = Path(train_path).resolve()
    for path in paths:
        p = Path(path)
        if p.name.endswith(SIDE_TABLE_SUFFIXES) or p.resolve() == train_file:
            continue
        trace = _signal_trace(p)
        if not trace.has_feature(column):
            rows.append({"trace": p.name, "domain": None, "n": len(trace), "spearman": None})
            continue
        X = trace.feature(column)
        if X.shape[1] != readout.d:
            raise CaptureError(f"{p}: column {column} has {X.shape[1]} dimensions, the read-out {readout.d}")
        pred = readout.predict_workload(X)
        true = trace.output_tokens
        domains = sorted(set(trace.domain.tolist()))
        for d in domains + (["(all)"] if len(domains) > 1 else []):
            m = trace.domain == d if d != "(all)" else np.ones(len(true), dtype=bool)
            rows.append({"trace": p.name, "domain": d, "n": int(m.sum()), "spearman": spearman(pred[m], true[m])})
    return head, rows


def signal_main(argv=None) -> int:
    p = OneLineParser(prog="capture-traces signal",
                      description="LEAP's read-out trained on --train: 5-fold CV Spearman "
                                  "in-sample, Spearman per domain on the other traces")
    p.add_argument("--train", required=True)
    p.add_argument("--feature", default="feat_last")
    p.add_argument("--json", action="store_true")
    p.add_argument("traces", nargs="*")
    a = p.parse_args(argv)
    head, rows = signal_rows(a.train, a.traces, a.feature)
    if a.json:
        print(json.dumps({"train": head, "rows": rows}, indent=1))
        return 0
    print(f"train {head['trace']} ({head['column']}, n={head['n']}): LEAP read-out, lambda = {head['lambda']:.4g} "
          f"(alpha {head['alpha']:.3g} x n, by 5-fold CV), 5-fold CV Spearman {head['cv_spearman']:.3f}")
    for r in rows:
        if r["domain"] is None:
            print(f"{r['trace']}: no {a.feature}")
        else:
            print(f"{r['trace']:<24}{r['domain']:<16}n={r['n']:>5}  Spearman {r['spearman']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
