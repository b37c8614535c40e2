"""The tables of a leap-serve run: request rows, and the live scheduler's per-step and per-request
read-outs (``leap_stats()``, ``leap_requests()``) where the engine core runs in this process."""

from __future__ import annotations

import math
import time

#: per-request engine-step columns (docs/semantics.md "Step clock"), int64, null where not counted
STEP_COLUMNS = ("arrival_step", "admit_step", "first_token_step", "finish_step")


def scheduler_stats(engine) -> dict | None:
    """The live scheduler's per-step stats (``leap_stats()``: dict of equal-length lists), where
    the engine core runs in this process (uni executor) and its scheduler has them."""
    core = getattr(getattr(engine, "engine_core", None), "engine_core", None)
    fn = getattr(getattr(core, "scheduler", None), "leap_stats", None)
    return fn() if callable(fn) else None


def first_estimates(engine, known) -> dict[str, float]:
    """The live scheduler's first length estimate of each finished request (``leap_requests()``),
    by the served request id. Empty without the live scheduler in this process; NaN estimates (no
    predictor) are left out."""
    got = finished_by_id(engine, known, "first_predicted")
    return {rid: float(v) for rid, v in got.items() if v is not None and math.isfinite(v)}


def finished_by_id(engine, known, column: str) -> dict:
    """One column of the live scheduler's finished requests (``leap_requests()``) by the served
    request id: vLLM's engine id is that id plus ``-`` and 8 random characters
    (``InputProcessor.assign_request_id``), or the id itself with the randomisation disabled."""
    core = getattr(getattr(engine, "engine_core", None), "engine_core", None)
    fn = getattr(getattr(core, "scheduler", None), "leap_requests", None)
    if not callable(fn):
        return {}
    got = fn()
    out = {}
    for engine_id, value in zip(got.get("request_id", []), got.get(column, [])):
        rid = engine_id if engine_id in known else engine_id.rsplit("-", 1)[0]
        if rid in known:
            out[rid] = value
    return out


def write_sched_part(store, stats: dict) -> None:
    import pyarrow as pa

    from core.io import atomic_write_parquet

    table = pa.table({**{k: pa.array(v) for k, v in stats.items()},
                      "run": pa.array([store.run] * len(next(iter(stats.values()), [])), pa.int32())})
    atomic_write_parquet(store.dir / f"sched-{store.run:03d}.parquet", table, compression="snappy")


def read_sched_parts(store):
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = sorted(store.dir.glob("sched-*.parquet"))
    return pa.concat_tables([pq.read_table(f) for f in files], promote_options="permissive") if files else None


def serve_table(fins, by_id, planned_of, run: int, shift: float, estimates: dict | None = None,
                preemptions: dict | None = None, cache: tuple[dict, dict, dict] | None = None):
    """Request rows of a serving run (the trace contract plus planned_arrival_s, run,
    source_output_tokens, predicted_tokens: the live scheduler's first length estimate, null
    without one, and the step columns; planned_arrival_s is null under the step clock). With a
    bound KV cache (``preemptions`` given, ``live/kv_cache.py``): ``preemptions`` per request; with
    vLLM's prefix caching on (``cache`` = (cached tokens, prompt hashes, hashes of the blocks past
    the prompt's) by request id): ``cached_tokens``, ``prefix_hashes`` and ``output_hashes``."""
    estimates = estimates or {}
    import pyarrow as pa

    rows = []
    for f in fins:
        r = by_id[f.request.request_id]
        tt = [float(x) for x in f.token_times_s]
        marks = f.step_marks or {}
        rows.append(dict(
            request_id=r.request_id, domain=r.domain, prompt_id=r.prompt_id, prompt_text=None,
            prompt_tokens=len(r.prompt_token_ids), output_tokens=int(f.output_tokens),
            finish_reason=f.finish_reason, max_tokens=r.length, arrival_s=f.arrival_s + shift,
            planned_arrival_s=planned_of[r.request_id], ttft_s=tt[0] if tt else None,
            e2e_s=tt[-1] if tt else None, token_times_s=tt or None, run=run,
            source_output_tokens=r.source_output_tokens, predicted_tokens=estimates.get(r.request_id),
            reference_output_tokens=r.reference_output_tokens,
            **{c: marks.get(c) for c in STEP_COLUMNS}))
    types = {"request_id": pa.string(), "domain": pa.string(), "prompt_id": pa.string(),
             "prompt_text": pa.string(), "prompt_tokens": pa.int32(), "output_tokens": pa.int32(),
             "finish_reason": pa.string(), "max_tokens": pa.int32(), "arrival_s": pa.float64(),
             "planned_arrival_s": pa.float64(), "ttft_s": pa.float64(), "e2e_s": pa.float64(),
             "token_times_s": pa.list_(pa.float64()), "run": pa.int32(),
             "source_output_tokens": pa.int32(), "predicted_tokens": pa.float64(),
             "reference_output_tokens": pa.int32(), **dict.fromkeys(STEP_COLUMNS, pa.int64())}
    if preemptions is not None:
        types["preemptions"] = pa.int32()
        for row in rows:
            row["preemptions"] = preemptions.get(row["request_id"], 0)
    if cache is not None:
        cached, hashes, outputs = cache
        types["cached_tokens"], types["prefix_hashes"] = pa.int32(), pa.list_(pa.int64())
        types["output_hashes"] = pa.list_(pa.int64())
        for row in rows:
            row["cached_tokens"] = cached.get(row["request_id"], 0)
            row["prefix_hashes"] = hashes[row["request_id"]]
            row["output_hashes"] = outputs.get(row["request_id"]) or []
    if any("replica" in (f.step_marks or {}) for f in fins):   # a live fleet (live.fleet)
        for row, f in zip(rows, fins):
            row["replica"] = f.step_marks["replica"]
        types["replica"] = pa.int32()
    return pa.table({k: pa.array([row[k] for row in rows], t) for k, t in types.items()})


def check_written(out, requests: int, t_start: float, log) -> int:
    """Load the trace just written (a failure is a bug of the writer, not bad input); log; exit 0."""
    from core.trace import TraceError, load_trace

    try:
        load_trace(out)
    except TraceError as e:
        raise RuntimeError(f"the serving trace does not validate: {e}") from None
    log(f"wrote {out} ({requests} requests) in {time.time() - t_start:.0f}s")
    return 0
