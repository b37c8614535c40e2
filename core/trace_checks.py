"""Validation and content hashing of trace tables: the checks behind :func:`core.trace.load_trace`
(one message naming the file, the column and the first bad row) and the hash that keys every
artifact trained on a trace. Kept apart from the :class:`core.trace.Trace` class that reads them."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from core.contract import MAX_REQUEST_TOKENS, METADATA_KEY, REQUIRED_COLUMNS, SCHEMA_VERSION, TraceError
from core.prefix_hashes import check_column as check_prefix_column
from core.rows import check_vectors

OPTIONAL_SCALAR_COLUMNS: dict[str, str] = {
    "prompt_text": "string",
    "arrival_s": "float",
    "ttft_s": "float",
    "e2e_s": "float",
    "reference_output_tokens": "integer",
}


FEATURE_COLUMNS = ("feat_last", "feat_mean", "feat_entropy_pooled", "text_embedding")


FINISH_REASONS = frozenset({"stop", "length"})


STEPS_COLUMNS = ("step_index", "step_s", "prefill_tokens", "decode_requests")


def _kind_of(dtype: pa.DataType) -> str:
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
        return "string"
    if pa.types.is_integer(dtype):
        return "integer"
    if pa.types.is_floating(dtype):
        return "float"
    if pa.types.is_null(dtype):
        return "null"
    return str(dtype)


def _first_true(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def _is_null(column: pa.ChunkedArray) -> np.ndarray:
    return column.is_null().to_numpy(zero_copy_only=False)


def vector_array(vectors, d: int, dtype=np.float16) -> pa.FixedSizeListArray:
    """A vector column (``fixed_size_list<dtype, d>``) from an (n, d) matrix or a list of 1-D vectors
    (a ``None`` entry becomes a null vector): how writers store hidden states and embeddings."""
    if isinstance(vectors, np.ndarray) and vectors.ndim == 2:
        if vectors.shape[1] != d:
            raise ValueError(f"vectors of shape {vectors.shape}, expected (n, {d})")
        return pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(vectors, dtype=dtype).reshape(-1)), d)
    n = len(vectors)
    mat = np.zeros((n, d), dtype=dtype)
    mask = np.zeros(n, dtype=bool)
    for i, v in enumerate(vectors):
        if v is None:
            mask[i] = True
            continue
        v = np.asarray(v)
        if v.shape != (d,):
            raise ValueError(f"vector of shape {v.shape}, expected ({d},)")
        mat[i] = v.astype(dtype)
    flat = pa.array(mat.reshape(-1))
    if mask.any():
        return pa.FixedSizeListArray.from_arrays(flat, d, mask=pa.array(mask))
    return pa.FixedSizeListArray.from_arrays(flat, d)


def vectors_to_numpy(column: pa.ChunkedArray | pa.FixedSizeListArray) -> np.ndarray:
    """An (n, d) float32 matrix of a vector column (a null vector reads as its stored values)."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    width = arr.type.list_size
    values = arr.values.slice(arr.offset * width, len(arr) * width).to_numpy(zero_copy_only=False)
    return values.reshape(len(arr), width).astype(np.float32, copy=False)


def _read_parquet(path: Path) -> pa.Table:
    try:
        return pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise TraceError(f"trace {path}: not a readable Parquet file ({exc})") from None


def _require_columns(path: Path, table: pa.Table, columns) -> None:
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise TraceError(f"trace {path}: missing required column(s) {', '.join(missing)}")


#: Metadata fields that change what a trace means to a predictor trained on it; everything else
#: (capture date, host, run timings, local paths) is provenance and stays out of the content hash.
HASHED_METADATA = ("schema_version", "model_id", "model_revision", "num_layers", "hidden_size", "layers")


def _digest_array(digest, arr: pa.Array) -> None:
    digest.update(f"{arr.type}|{len(arr)}|{arr.null_count}|".encode())
    if arr.null_count:
        digest.update(np.packbits(arr.is_null().to_numpy(zero_copy_only=False)).tobytes())
    if pa.types.is_fixed_size_list(arr.type):
        _digest_array(digest, arr.flatten())
    elif pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type) or pa.types.is_boolean(arr.type):
        digest.update(np.ascontiguousarray(arr.to_numpy(zero_copy_only=False)).tobytes())
    else:
        digest.update(json.dumps(arr.to_pylist(), default=str, ensure_ascii=False).encode())


def trace_content_hash(table: pa.Table, meta: dict) -> str:
    """sha256 of what a trace holds: every column (name, type, nulls, values, in file order) and the
    metadata fields in :data:`HASHED_METADATA`. Independent of the file's encoding, compression,
    row groups and provenance metadata, so rewriting a file's metadata or repacking it keeps the key
    of artifacts trained on it (predictors/weights/, the fit caches)."""
    digest = hashlib.sha256(b"leap.trace.content/1\n")
    digest.update(json.dumps({k: meta.get(k) for k in HASHED_METADATA}, sort_keys=True).encode())
    for name in table.column_names:
        digest.update(f"\n{name}\n".encode())
        _digest_array(digest, table.column(name).combine_chunks())
    return digest.hexdigest()


def read_metadata(table: pa.Table, path: Path) -> dict:
    raw = (table.schema.metadata or {}).get(METADATA_KEY)
    if raw is None:
        raise TraceError(f"trace {path}: missing Parquet metadata key {METADATA_KEY.decode()!r}")
    try:
        meta = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise TraceError(f"trace {path}: metadata {METADATA_KEY.decode()!r} is not JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise TraceError(f"trace {path}: metadata {METADATA_KEY.decode()!r} must be a JSON object")
    version = meta.get("schema_version")
    if version != SCHEMA_VERSION:
        raise TraceError(f"trace {path}: schema_version {version!r} is not supported "
                         f"(this reader understands {SCHEMA_VERSION})")
    return meta


def validate_table(table: pa.Table, meta: dict, path: Path) -> None:
    """Check a request table against the contract; raises TraceError on the first problem."""
    _require_columns(path, table, REQUIRED_COLUMNS)
    n = table.num_rows
    if n == 0:
        raise TraceError(f"trace {path}: has no requests")
    for column, kind in {**REQUIRED_COLUMNS, **OPTIONAL_SCALAR_COLUMNS}.items():
        if column not in table.column_names:
            continue
        actual = _kind_of(table.schema.field(column).type)
        if actual != kind and not (actual == "null" and column in OPTIONAL_SCALAR_COLUMNS):
            raise TraceError(f"trace {path}: column {column}: expected {kind}, found "
                             f"{table.schema.field(column).type}")
        if column in REQUIRED_COLUMNS and table.column(column).null_count:
            row = _first_true(_is_null(table.column(column)))
            raise TraceError(f"trace {path}: column {column}: row {row}: null value")
    if pc.count_distinct(table.column("request_id")).as_py() != n:   # vectorised; the loop only names the row
        ids = table.column("request_id").to_pylist()
        seen: set = set()
        for row, rid in enumerate(ids):
            if rid in seen:
                raise TraceError(f"trace {path}: column request_id: row {row}: duplicate id {rid!r}")
            seen.add(rid)
    for column in ("prompt_tokens", "output_tokens", "max_tokens"):
        values = table.column(column).to_numpy()
        if (values < 1).any():
            row = _first_true(values < 1)
            raise TraceError(f"trace {path}: column {column}: row {row}: must be >= 1, found {values[row]}")
        if (values > MAX_REQUEST_TOKENS).any():
            row = _first_true(values > MAX_REQUEST_TOKENS)
            raise TraceError(f"trace {path}: column {column}: row {row}: {values[row]} tokens is beyond any "
                             f"model's context (limit {MAX_REQUEST_TOKENS:,}); a corrupt value?")
    known = pc.is_in(table.column("finish_reason"), value_set=pa.array(sorted(FINISH_REASONS)))
    if not pc.all(known).as_py():
        row = _first_true(~known.to_numpy(zero_copy_only=False))
        reason = table.column("finish_reason")[row].as_py()
        raise TraceError(f"trace {path}: column finish_reason: row {row}: {reason!r} is not "
                         f"'stop' or 'length'")
    out = table.column("output_tokens").to_numpy()
    cap = table.column("max_tokens").to_numpy()
    if (out > cap).any():
        row = _first_true(out > cap)
        raise TraceError(f"trace {path}: column output_tokens: row {row}: {out[row]} exceeds max_tokens {cap[row]}")
    for column in ("arrival_s", "ttft_s", "e2e_s"):
        if column in table.column_names and _kind_of(table.schema.field(column).type) == "float":
            values = table.column(column).to_numpy(zero_copy_only=False).astype(np.float64)
            bad = (~np.isnan(values) & ~np.isfinite(values)) | (values < 0)
            if column == "arrival_s":   # a null is an unknown time; a stored NaN would be replayed as one
                bad |= np.isnan(values) & ~_is_null(table.column(column))
            if bad.any():
                row = _first_true(bad)
                raise TraceError(f"trace {path}: column {column}: row {row}: {values[row]} is not a finite, "
                                 f"non-negative time")
    check_prefix_column(table, meta, f"trace {path}")
    hidden = meta.get("hidden_size")
    for column in FEATURE_COLUMNS:
        if column not in table.column_names:
            continue
        dtype = table.schema.field(column).type
        if not pa.types.is_fixed_size_list(dtype) or not (
            pa.types.is_float16(dtype.value_type) or pa.types.is_float32(dtype.value_type)
        ):
            raise TraceError(f"trace {path}: column {column}: expected fixed_size_list<float16|float32>, "
                             f"found {dtype}")
        col = table.column(column)
        if col.null_count:
            row = _first_true(_is_null(col))
            raise TraceError(f"trace {path}: column {column}: row {row}: missing vector")
        check_vectors(f"trace {path}", column, vectors_to_numpy(col), None if column == "text_embedding" else hidden)


def validate_steps(table: pa.Table, path: Path) -> None:
    _require_columns(path, table, STEPS_COLUMNS)
    for column in STEPS_COLUMNS:
        col = table.column(column)
        if col.null_count:
            row = _first_true(_is_null(col))
            raise TraceError(f"trace {path}: column {column}: row {row}: missing value")
    step_s = table.column("step_s").to_numpy(zero_copy_only=False).astype(np.float64)
    bad = ~np.isfinite(step_s) | (step_s <= 0)
    if bad.any():
        row = _first_true(bad)
        raise TraceError(f"trace {path}: column step_s: row {row}: {step_s[row]} is not a positive duration")
    for column in ("prefill_tokens", "decode_requests"):
        values = table.column(column).to_numpy(zero_copy_only=False)
        if (values < 0).any():
            row = _first_true(values < 0)
            raise TraceError(f"trace {path}: column {column}: row {row}: negative count")
