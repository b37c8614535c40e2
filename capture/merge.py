"""Merge traces recorded as shards (disjoint prompt slices, same settings) into one trace.

A long recording can be split over several machines, GPUs or cores: each shard records its own
``--prompts SOURCE@a:b`` slice into its own file with identical settings, and

    capture-traces merge traces/NAME.parquet traces/NAME-a.parquet traces/NAME-b.parquet

writes one trace as if recorded in one go: rows in input order, decode and steps side tables
concatenated (each shard's engine runs renumbered after the previous shard's, so step timings stay
attributable), metadata recounted. The output may be one of the inputs; every input is read before
anything is written, and every file is written atomically (side tables first, main file last).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from core.trace import METADATA_KEY, is_complete, side_table_path

from . import CaptureError
from .finalize import combine_crosscheck
from .store import atomic_write_table, check_output_trace, read_meta


@dataclass
class _Shard:
    """One input trace, read whole before anything is written."""
    path: Path
    meta: dict
    main: pa.Table
    decode: pa.Table | None
    steps: pa.Table | None
    side_meta: dict  # side table name -> that table's own metadata

    @classmethod
    def read(cls, path: Path) -> _Shard:
        if not path.is_file():
            raise CaptureError(f"no such file: {path}")
        meta = read_meta(path)
        side = {name: _side(path, name, meta) for name in ("decode", "steps")}
        return cls(path, meta, pq.read_table(path), side["decode"] and side["decode"][0],
                   side["steps"] and side["steps"][0], {k: v[1] for k, v in side.items() if v})


def _side(path, name, meta):
    """(table, its metadata) of a side table named in ``meta``, or None."""
    table_name = (meta.get("side_tables") or {}).get(name)
    if not table_name:
        return None
    p = path.with_name(table_name)
    if not p.is_file():
        raise CaptureError(f"{path}: side table {p.name} is missing")
    try:
        table = pq.read_table(p)
    except (OSError, pa.ArrowException) as e:
        raise CaptureError(f"{p}: not a readable Parquet file ({str(e).splitlines()[0]})") from None
    raw = (table.schema.metadata or {}).get(METADATA_KEY)
    return table, (json.loads(raw) if raw else {})


def _concat(tables, what):
    present = [t for t in tables if t is not None]
    if not present:
        return None
    # steps tables gain columns as the recorder does (decode_context, prefill_sq, probe_s, probe_mem_s): an
    # older shard's rows get nulls there; other tables must match exactly
    promote = {"promote_options": "permissive"} if what == "steps" else {}
    try:
        return pa.concat_tables([t.replace_schema_metadata(None) for t in present], **promote)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise CaptureError(f"merge: the inputs' {what} tables differ in schema ({e})") from None


def merge(out, inputs) -> dict:
    """Merge finished shard traces ``inputs`` into ``out``; returns the merged metadata."""
    if len(inputs) < 2:
        raise CaptureError("merge needs an output and at least two input traces")
    shards = [_Shard.read(path) for path in inputs]
    side_meta: dict[str, dict] = {name: next((s.side_meta[name] for s in shards if name in s.side_meta), {})
                 for name in ("decode", "steps")}
    first = shards[0]
    for shard in shards[1:]:
        if shard.meta.get("run_config") != first.meta.get("run_config"):
            raise CaptureError(f"merge: {shard.path} was recorded with other settings than {first.path} "
                               "(run_config differs)")
    seen: dict[str, str] = {}
    for shard in shards:
        for rid in shard.main.column("request_id").to_pylist():
            if rid in seen:
                raise CaptureError(f"merge: request {rid} is in both {seen[rid]} and {shard.path.name}")
            seen[rid] = shard.path.name

    main = _concat([s.main for s in shards], "main")
    decode = _concat([s.decode for s in shards], "decode")
    steps_parts, runs, offset = [], [], 0
    for shard in shards:
        shard_runs = [dict(r, run=int(r.get("run", i)) + offset, shard=shard.path.name)
                      for i, r in enumerate(shard.meta.get("runs") or [])]
        runs.extend(shard_runs)
        top = max([r["run"] for r in shard_runs] + [offset - 1])
        steps = shard.steps
        if steps is not None:
            run_type = steps.schema.field("run").type
            steps = steps.set_column(steps.schema.get_field_index("run"), "run",
                                     pc.add(steps.column("run"), pa.scalar(offset, run_type)).cast(run_type))
            top = max(top, int(pc.max(steps.column("run")).as_py() or 0))
            steps_parts.append(steps)
        offset = top + 1
    steps = _concat(steps_parts, "steps")
    if steps is not None:
        steps = steps.set_column(steps.schema.get_field_index("step_index"), "step_index",
                                 pa.array(np.arange(steps.num_rows, dtype=np.int64)))

    metas = [s.meta for s in shards]
    meta = dict(first.meta)
    domains: dict[str, int] = {}
    for d in main.column("domain").to_pylist():
        domains[d] = domains.get(d, 0) + 1
    sources = list(dict.fromkeys(s for m in metas for s in m.get("prompt_sources") or []))
    meta.update({
        "num_requests": main.num_rows,
        "planned_requests": sum(m.get("planned_requests") or m.get("num_requests") or 0 for m in metas),
        "complete": all(is_complete(m) for m in metas),
        "domains": domains,
        "prompt_sources": sources,
        "skipped_long_prompts": sum(m.get("skipped_long_prompts") or 0 for m in metas),
        "capture_date": max(str(m.get("capture_date", "")) for m in metas),
        "runs": runs,
        "feat_last_crosscheck": _merge_crosscheck(metas),
        "merged_from": [{"file": s.path.name, "requests": s.main.num_rows, "complete": is_complete(s.meta)}
                        for s in shards],
        "side_tables": {},
    })
    # read everything above; now write: side tables first, the main file (which names them) last
    if decode is not None and decode.num_rows:
        p = side_table_path(out, "decode")
        meta["side_tables"]["decode"] = p.name
        atomic_write_table(decode, p, dict(side_meta["decode"], trace=out.name))
    if steps is not None and steps.num_rows:
        p = side_table_path(out, "steps")
        meta["side_tables"]["steps"] = p.name
        atomic_write_table(steps, p, dict(side_meta["steps"], trace=out.name))
    atomic_write_table(main, out, meta)
    return meta


def _merge_crosscheck(metas) -> dict:
    merged: dict = {}
    for m in metas:
        combine_crosscheck(merged, m.get("feat_last_crosscheck") or {}, "median of the first shard only")
    return merged


def merge_main(argv) -> int:
    from core.errors import OneLineParser

    ap = OneLineParser(prog="capture-traces merge",
                       description="merge shard traces (same settings, disjoint prompts) into one")
    ap.add_argument("out", type=Path, metavar="OUT.parquet")
    ap.add_argument("inputs", type=Path, nargs="+", metavar="SHARD.parquet")
    args = ap.parse_args(argv)
    check_output_trace(args.out, "merge: the output")
    meta = merge(args.out, args.inputs)
    print(f"merged {len(args.inputs)} traces into {args.out}: {meta['num_requests']} requests"
          + ("" if meta["complete"] else " (partial)"))
    return 0
