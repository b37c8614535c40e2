"""Assemble the parts of a recording into the final trace files (atomic)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from core.trace import is_complete, side_table_path, vectors_to_numpy

from . import CaptureError
from .schema import PREFIX_BLOCK
from .store import atomic_write_table, dedupe_first

PREFILL_COLS = ("feat_mean", "feat_entropy_pooled", "text_embedding")


def _rows_of(table: pa.Table, ids: list[str]) -> pa.Table:
    pos = {r: i for i, r in enumerate(table.column("request_id").to_pylist())}
    return table.take(pa.array([pos[r] for r in ids], type=pa.int64()))


def _complete_rows(store, kind: str, ids, if_none: str, if_missing: str):
    """The store's ``kind`` rows, first copy of each request, in ``ids`` order; every id present."""
    rows = store.read(kind)
    if rows is None:
        raise CaptureError(if_none)
    rows = dedupe_first(rows, ["request_id"])
    have = set(rows.column("request_id").to_pylist())
    missing = [r for r in ids if r not in have]
    if missing:
        raise CaptureError(f"{len(missing)} {if_missing} (first {missing[0]}); rerun with --resume")
    return _rows_of(rows, ids)


def combine_crosscheck(acc: dict, other: dict, median_note: str) -> None:
    """Fold ``other``'s per-column cross-check figures into ``acc``: worst error, rows summed
    (the median of a union cannot be rebuilt from two medians, hence the note)."""
    for name, cc in other.items():
        mine = acc.get(name)
        if mine is None:
            acc[name] = dict(cc)
            continue
        mine["max_rel_err"] = max(mine.get("max_rel_err", 0.0), cc.get("max_rel_err", 0.0))
        mine["rows"] = mine.get("rows", 0) + cc.get("rows", 0)
        mine["median_rel_err_note"] = median_note


def finalize(store, prompts, meta: dict, backend_info: dict | None, hidden: int, log=print):
    ids = [p.request_id for p in prompts]
    table = _complete_rows(store, "gen", ids, f"{store.out}: nothing recorded",
                           "requests were not recorded")
    column_backends = {c: (backend_info or {}).get("backend", "?")
                       for c in table.column_names if c.startswith("feat_last")}
    crosscheck = {}
    prefill_cols = []
    if meta["run_config"].get("prefill_features"):
        feat = _complete_rows(store, "feat", ids, "prefill features missing; rerun with --resume",
                              "requests lack prefill features")
        for c in PREFILL_COLS:
            if c in feat.column_names:
                table = table.append_column(c, feat.column(c))
                column_backends[c] = "transformers (prefill-only pass)"
                prefill_cols.append(c)
        for c in feat.column_names:
            if c.startswith("check_"):
                k = int(c.split("_")[1])
                name = next((n for n, v in meta["layers"].items()
                             if v == k and n.startswith("feat_last")), None)
                if name is None:
                    continue
                ok = np.asarray(feat.column(c).is_valid().to_numpy(zero_copy_only=False))
                if not ok.any():
                    continue
                rows = pa.array(np.flatnonzero(ok), type=pa.int64())
                a = vectors_to_numpy(table.column(name).take(rows)).astype(np.float64)
                b = vectors_to_numpy(feat.column(c).take(rows)).astype(np.float64)
                rel = np.linalg.norm(a - b, axis=1) / np.maximum(np.linalg.norm(b, axis=1), 1e-30)
                crosscheck[name] = {"against": "transformers fp32 prefill, same layer",
                                    "median_rel_err": float(np.median(rel)),
                                    "max_rel_err": float(rel.max()), "rows": int(ok.sum())}
    prev_cc = store.dir / "crosscheck_prev.json"
    if prev_cc.exists():  # rows recorded before a finalize-partial / extension
        combine_crosscheck(crosscheck, json.loads(prev_cc.read_text()),
                           "median over the rows of the latest runs only")
    # reorder: reference_output_tokens last, like the contract table
    order = [c for c in table.column_names if c != "reference_output_tokens"] + \
        ["reference_output_tokens"]
    table = table.select(order)

    # side tables
    dec = store.read("dec")
    idset = set(ids)
    if dec is not None and dec.num_rows:
        dec = dec.filter(pc.is_in(dec.column("request_id"), value_set=pa.array(list(idset))))
        dec = dedupe_first(dec, ["request_id", "generated_tokens", "layer"])
        rank = {r: i for i, r in enumerate(ids)}
        key = sorted(range(dec.num_rows), key=lambda i: (
            rank[dec.column("request_id")[i].as_py()], dec.column("layer")[i].as_py(),
            dec.column("generated_tokens")[i].as_py()))
        dec = dec.take(pa.array(key, type=pa.int64()))
    steps = store.read("steps")
    if steps is not None and steps.num_rows:
        idx = pc.sort_indices(steps, sort_keys=[("run", "ascending"), ("run_step", "ascending")])
        steps = steps.take(idx)
        if "step_index" in steps.column_names:  # parts seeded from an earlier final file
            steps = steps.drop_columns(["step_index"])
        steps = steps.append_column("step_index", pa.array(np.arange(steps.num_rows, dtype=np.int64)))
        first = ["step_index", "wall_start_s", "step_s", "prefill_requests", "prefill_tokens",
                 "decode_requests", "decode_tokens", "kv_usage", "run", "run_step"]
        steps = steps.select(first + [c for c in steps.column_names if c not in first])

    runs = []
    for f in sorted(store.dir.glob("run-*.json")):
        try:
            r = json.loads(f.read_text())
            r["run"] = int(f.stem.split("-")[1])
            runs.append(r)
        except (ValueError, OSError):
            pass
    prev = store.dir / "runs_prev.json"
    if prev.exists():
        runs = json.loads(prev.read_text()) + runs
    bi = dict(backend_info or {})
    meta = dict(meta)
    if "prefix_hashes" in table.column_names:   # the column's block size travels with it (docs/traces.md)
        meta.setdefault("prefix_block_size", PREFIX_BLOCK)
    meta.update({
        "backend": bi.get("backend"),
        "backend_version": bi.get("backend_version"),
        "eager": bi.get("eager"),
        "backend_details": {k: v for k, v in bi.items()
                            if k not in ("backend", "backend_version", "eager")},
        "column_backends": column_backends,
        "prefill_pass_columns": prefill_cols,
        "feat_last_crosscheck": crosscheck,
        "runs": runs,
        "num_requests": table.num_rows,
        "domains": _counts(table.column("domain").to_pylist()),
        "side_tables": {},
    })
    meta["sampling"] = dict(meta["sampling"])
    if dec is not None and dec.num_rows:
        p = side_table_path(store.out, "decode")
        meta["side_tables"]["decode"] = p.name
        atomic_write_table(dec, p, {"schema_version": meta["schema_version"], "table": "decode",
                                    "trace": store.out.name, "decode_every_k": meta["decode_every_k"],
                                    "decode_layers": meta["decode_layers"],
                                    "hidden_size": hidden})
    if steps is not None and steps.num_rows:
        p = side_table_path(store.out, "steps")
        meta["side_tables"]["steps"] = p.name
        atomic_write_table(steps, p, {"schema_version": meta["schema_version"], "table": "steps",
                                      "trace": store.out.name,
                                      "kv_usage": "blocks held by scheduled requests / KV blocks "
                                                  "(worker-side estimate)",
                                      "wall_start_s": "seconds since the run's engine start; "
                                                      "`run` numbers resumed runs"})
    atomic_write_table(table, store.out, meta)
    if is_complete(meta):
        store.remove()
    # else (a partial trace, --finalize-partial): the parts folder stays, so that a --resume here
    # keeps the unfinished prompts' prefill features instead of recomputing them
    log(f"finalized {store.out}: {table.num_rows} requests"
        + (f", {dec.num_rows} decode rows" if dec is not None else "")
        + (f", {steps.num_rows} steps" if steps is not None else "")
        + (f", feat_last vs HF max rel err {crosscheck['feat_last']['max_rel_err']:.2e}"
           if "feat_last" in crosscheck else ""))


def _counts(xs) -> dict:
    out: dict = {}
    for x in xs:
        out[x] = out.get(x, 0) + 1
    return out
