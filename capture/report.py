"""Summaries of recorded traces (numpy + pyarrow only).

    capture-traces report traces/*.parquet
        per domain: requests, prompt/output token percentiles, share hitting the cap,
        and per trace the capture throughput (generated tokens / wall seconds of the runs).
    capture-traces signal --train traces/lmsys.parquet traces/*.parquet
        ridge regression of sqrt(output_tokens) on feat_last fitted on the training trace
        (5-fold CV Spearman in-sample), Spearman of the prediction per domain elsewhere.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

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
    raw = (t.schema.metadata or {}).get(b"leap.trace")
    meta = json.loads(raw) if raw else {}
    return t, meta


def _vec(t, col):
    c = t.column(col).combine_chunks()
    return c.values.to_numpy(zero_copy_only=False).reshape(len(c), -1).astype(np.float64)


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
    p = argparse.ArgumentParser(prog="capture-traces report")
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


def spearman(a, b) -> float:
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    if len(a) < 3:
        return float("nan")

    def rank(x):
        order = np.argsort(x, kind="mergesort")
        r = np.empty(len(x), np.float64)
        r[order] = np.arange(len(x), dtype=np.float64)
        # average ties
        xs = x[order]
        i = 0
        while i < len(xs):
            j = i
            while j + 1 < len(xs) and xs[j + 1] == xs[i]:
                j += 1
            if j > i:
                r[order[i:j + 1]] = (i + j) / 2.0
            i = j + 1
        return r

    ra, rb = rank(a), rank(b)
    ra -= ra.mean()
    rb -= rb.mean()
    den = np.sqrt((ra ** 2).sum() * (rb ** 2).sum())
    return float((ra * rb).sum() / den) if den else float("nan")


class Ridge:
    def __init__(self, alpha=1.0):
        self.alpha = alpha

    def fit(self, X, y):
        self.mu = X.mean(0)
        self.sd = X.std(0) + 1e-6
        Z = (X - self.mu) / self.sd
        self.ym = y.mean()
        A = Z.T @ Z + self.alpha * np.eye(Z.shape[1])
        self.w = np.linalg.solve(A, Z.T @ (y - self.ym))
        return self

    def predict(self, X):
        return ((X - self.mu) / self.sd) @ self.w + self.ym


def _cv_alpha(X, y, alphas=(1, 10, 100, 1000, 1e4, 1e5, 1e6), k=5, seed=0):
    rng = np.random.default_rng(seed)
    folds = np.array_split(rng.permutation(len(y)), k)
    best = None
    for a in alphas:
        pred = np.empty(len(y))
        for f in folds:
            tr = np.setdiff1d(np.arange(len(y)), f)
            pred[f] = Ridge(a).fit(X[tr], y[tr]).predict(X[f])
        s = spearman(pred, y)
        if best is None or s > best[1]:
            best = (a, s)
    return best


def signal_main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="capture-traces signal")
    p.add_argument("--train", required=True)
    p.add_argument("--feature", default="feat_last")
    p.add_argument("traces", nargs="*")
    a = p.parse_args(argv)
    t, _ = _load(a.train)
    if a.feature not in t.column_names:
        raise CaptureError(f"{a.train}: no column {a.feature!r} to train on")
    X = _vec(t, a.feature)
    y = np.sqrt(t.column("output_tokens").to_numpy().astype(np.float64))
    alpha, cv = _cv_alpha(X, y)
    model = Ridge(alpha).fit(X, y)
    print(f"train {Path(a.train).name} ({a.feature}, n={len(y)}): ridge alpha={alpha}, "
          f"5-fold CV Spearman {cv:.3f}")
    for path in a.traces:
        if Path(path).resolve() == Path(a.train).resolve():
            continue
        u, _ = _load(path)
        if a.feature not in u.column_names:
            print(f"{Path(path).name}: no {a.feature}")
            continue
        Xu = _vec(u, a.feature)
        yu = u.column("output_tokens").to_numpy().astype(np.float64)
        pred = model.predict(Xu)
        dom = np.asarray(u.column("domain").to_pylist(), dtype=object)
        for d in sorted(set(dom.tolist())):
            m = dom == d
            print(f"{Path(path).name:<24}{d:<16}n={int(m.sum()):>5}  Spearman {spearman(pred[m], yu[m]):.3f}")
        if len(set(dom.tolist())) > 1:
            print(f"{Path(path).name:<24}{'(all)':<16}n={len(yu):>5}  Spearman {spearman(pred, yu):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
