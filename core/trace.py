"""The Parquet trace contract: reading, validating and naming recorded traces (the one definition
that capture, predictors and the simulator all import).

One trace is ``NAME.parquet`` (one row per request) with optional side tables beside it:
``NAME.steps.parquet`` (per engine step timings) and ``NAME.decode.parquet`` (hidden states
sampled during decode). Every part of the project reads traces through :func:`load_trace`, so a
bad file fails in one place with one message naming the file, the column and the first bad row.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from core.contract import MAX_REQUEST_TOKENS, METADATA_KEY, REQUIRED_COLUMNS, SCHEMA_VERSION, TraceError
from core.importers import detect_format, import_table
from core.io import shareable_path
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
DECODE_COLUMNS = ("request_id", "generated_tokens", "layer", "vector")


#: Columns that reveal a request's true output length (hidden from non-oracle predictors).
LENGTH_COLUMNS = ("output_tokens", "finish_reason", "reference_output_tokens")


def traces_dir() -> Path:
    """Where bundled traces live: ``$LEAP_TRACES_DIR`` or the repository's ``traces/``."""
    env = os.environ.get("LEAP_TRACES_DIR")
    return Path(env) if env else Path(__file__).resolve().parent.parent / "traces"


def bundled_trace_names() -> list[str]:
    root = traces_dir()
    if not root.is_dir():
        return []
    return sorted(
        p.name[: -len(".parquet")]
        for p in root.glob("*.parquet")
        if p.name.count(".") == 1
    )


def resolve_trace_path(path_or_name: str | os.PathLike) -> Path:
    """A path to an existing file, or the name of a bundled trace (``sharegpt`` -> traces/sharegpt.parquet)."""
    text = str(path_or_name)
    candidate = Path(text)
    if candidate.suffix == ".parquet" or os.sep in text or candidate.exists():
        if not candidate.is_file():
            raise TraceError(f"trace {text}: no such file")
        return candidate
    bundled = traces_dir() / f"{text}.parquet"
    if bundled.is_file():
        return bundled
    names = ", ".join(bundled_trace_names()) or "none"
    raise TraceError(f"trace {text!r}: not a file and not a bundled trace (bundled: {names})")


def trace_reference(spec):
    """A trace as named in shared outputs (config.json, results): a bundled trace by its name, any
    other file by :func:`core.io.shareable_path` (relative path, or file name + content hash)."""
    if not isinstance(spec, (str, os.PathLike)):
        return spec
    text = str(spec)
    path = Path(text)
    if not (path.suffix == ".parquet" or os.sep in text or path.exists()):
        return text
    stem = path.name[: -len(".parquet")] if path.name.endswith(".parquet") else None
    try:
        bundled = stem is not None and path.is_file() and \
            path.resolve() == (traces_dir() / path.name).resolve() and stem in bundled_trace_names()
    except OSError:
        bundled = False
    return stem if bundled else shareable_path(path)


def side_table_path(trace_path: Path, kind: str) -> Path:
    """``NAME.parquet`` -> ``NAME.KIND.parquet`` (``steps``, ``decode``, ``sched``): where a side table
    of a trace lives. A path without the ``.parquet`` suffix keeps its whole name as the stem."""
    trace_path = Path(trace_path)
    name = trace_path.name
    stem = name[: -len(".parquet")] if name.endswith(".parquet") else name
    return trace_path.with_name(f"{stem}.{kind}.parquet")


def is_complete(meta: dict) -> bool:
    """A trace is complete unless its metadata says ``complete: false`` (a partial recording);
    traces written before the flag existed are complete."""
    return meta.get("complete", True) is not False


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


@dataclass(frozen=True)
class Trace:
    """A validated trace: request columns as numpy arrays, features on demand."""

    name: str
    path: Path | None
    table: pa.Table
    metadata: dict
    content_hash: str
    steps: pa.Table | None = None
    decode_path: Path | None = None
    _feature_cache: dict = field(default_factory=dict, repr=False, compare=False)

    def __len__(self) -> int:
        return self.table.num_rows

    @property
    def complete(self) -> bool:
        """False for a partial recording (metadata ``complete: false``); older traces are complete."""
        return is_complete(self.metadata)

    @cached_property
    def request_id(self) -> np.ndarray:
        return np.asarray(self.table.column("request_id").to_pylist(), dtype=object)

    @cached_property
    def domain(self) -> np.ndarray:
        return np.asarray(self.table.column("domain").to_pylist(), dtype=object)

    @cached_property
    def prompt_tokens(self) -> np.ndarray:
        return self.table.column("prompt_tokens").to_numpy().astype(np.int64)

    @cached_property
    def output_tokens(self) -> np.ndarray:
        if "output_tokens" not in self.table.column_names:
            raise TraceError(f"trace {self.name}: the true output lengths are hidden here (a predictor sees "
                             "them only as feedback on finished requests; oracles opt in with sees_true_lengths)")
        return self.table.column("output_tokens").to_numpy().astype(np.int64)

    @cached_property
    def max_tokens(self) -> np.ndarray:
        return self.table.column("max_tokens").to_numpy().astype(np.int64)

    @cached_property
    def arrival_s(self) -> np.ndarray | None:
        if "arrival_s" not in self.table.column_names:
            return None
        col = self.table.column("arrival_s")
        if col.null_count:
            return None
        return col.to_numpy().astype(np.float64)

    @property
    def output_cap(self) -> int:
        """The cap M of the capture (largest max_tokens)."""
        return int(self.max_tokens.max()) if len(self) else 1

    def has_feature(self, column: str) -> bool:
        return column in self.table.column_names

    def feature(self, column: str) -> np.ndarray:
        """An (n, d) float32 matrix of a vector column, e.g. ``feat_last``."""
        if column not in self._feature_cache:
            if column not in self.table.column_names:
                raise TraceError(f"trace {self.name}: has no column {column!r} (columns: "
                                 f"{', '.join(self.table.column_names)})")
            self._feature_cache[column] = vectors_to_numpy(self.table.column(column))
        return self._feature_cache[column]

    def feature_layer(self, column: str) -> int | None:
        return (self.metadata.get("layers") or {}).get(column)

    def take(self, rows: np.ndarray) -> Trace:
        """A sub-trace of the given row indices (features sliced lazily)."""
        rows = np.asarray(rows, dtype=np.int64)
        sub = self.table.take(pa.array(rows))
        digest = hashlib.sha256(self.content_hash.encode() + rows.tobytes()).hexdigest()
        return Trace(name=self.name, path=self.path, table=sub, metadata=self.metadata,
                     content_hash=digest, steps=self.steps, decode_path=self.decode_path)

    def without_lengths(self) -> Trace:
        """The same requests with what reveals their true output length removed (``output_tokens``,
        ``finish_reason``, ``reference_output_tokens``): what a non-oracle predictor is bound to."""
        hidden = [c for c in LENGTH_COLUMNS if c in self.table.column_names]
        return Trace(name=self.name, path=self.path, table=self.table.drop_columns(hidden), metadata=self.metadata,
                     content_hash=self.content_hash, steps=self.steps, decode_path=self.decode_path)

    def decode_vectors(self, layer: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(row, generated_tokens, vectors) of one tapped layer from the decode side table, for this
        trace's own requests (works on a ``take`` sub-trace), sorted by (row, generated)."""
        if self.decode_path is None:
            raise TraceError(f"trace {self.name}: has no decode side table (NAME.decode.parquet)")
        try:
            table = pq.read_table(self.decode_path, filters=[("layer", "=", int(layer))])
        except (OSError, pa.ArrowException) as exc:
            raise TraceError(f"trace {self.decode_path}: not a readable Parquet file ({exc})") from None
        _require_columns(self.decode_path, table, DECODE_COLUMNS)
        ids = table.column("request_id").to_pylist()
        self._check_decode_ids(ids)
        index = {rid: i for i, rid in enumerate(self.request_id.tolist())}
        keep = np.fromiter((rid in index for rid in ids), dtype=bool, count=len(ids))
        rows = np.fromiter((index[rid] for rid, k in zip(ids, keep) if k), dtype=np.int64, count=int(keep.sum()))
        table = table.filter(pa.array(keep))
        generated = table.column("generated_tokens").to_numpy().astype(np.int64)
        vectors = vectors_to_numpy(table.column("vector"))
        check_vectors(f"trace {self.decode_path}", "vector", vectors, self.metadata.get("hidden_size"),
                      rows=f"layer {layer}, entry")
        order = np.lexsort((generated, rows))
        return rows[order], generated[order], vectors[order]

    def _check_decode_ids(self, ids: list) -> None:
        """Every id of the decode side table must be a request of the trace file (the contract):
        a row of another trace's table would otherwise be dropped without a word."""
        known = set(pq.read_table(self.path, columns=["request_id"]).column("request_id").to_pylist()) \
            if self.path is not None and self.path.is_file() else set(self.request_id.tolist())
        for row, rid in enumerate(ids):
            if rid not in known:
                raise TraceError(f"trace {self.decode_path}: column request_id: row {row}: "
                                 f"unknown request id {rid!r}")

    def decode_features(self) -> pa.Table:
        """The decode side table, validated against the trace file's ids and restricted to this
        trace's requests (so it also works on a ``take`` sub-trace)."""
        if self.decode_path is None:
            raise TraceError(f"trace {self.name}: has no decode side table")
        table = _read_parquet(self.decode_path)
        _require_columns(self.decode_path, table, DECODE_COLUMNS)
        ids = table.column("request_id").to_pylist()
        self._check_decode_ids(ids)
        check_vectors(f"trace {self.decode_path}", "vector", vectors_to_numpy(table.column("vector")),
                      self.metadata.get("hidden_size"))
        mine = set(self.request_id.tolist())
        return table.filter(pa.array([rid in mine for rid in ids]))


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


_CACHE: dict[tuple[str, float, int], Trace] = {}


def import_trace(path: str | os.PathLike, fmt: str | None = None) -> Trace:
    """A public lengths-only trace file (Azure, Mooncake, a CSV/Parquet of token counts; format
    detected unless given) as a validated :class:`Trace` (:mod:`core.importers` reads it)."""
    imported = import_table(Path(path), fmt)
    validate_table(imported.table, imported.metadata, imported.path)
    return Trace(name=imported.name, path=imported.path, table=imported.table, metadata=imported.metadata,
                 content_hash=imported.content_hash)


def load_trace(path_or_name: str | os.PathLike) -> Trace:
    """Read and validate a trace (path or bundled name). Raises :class:`TraceError`. Public
    lengths-only traces (``.csv``, ``.jsonl``, a Parquet of token counts without the contract's
    metadata) are imported on the way (:mod:`core.importers`)."""
    path = resolve_trace_path(path_or_name)
    stat = path.stat()
    key = (str(path.resolve()), stat.st_mtime, stat.st_size)
    if key in _CACHE:
        return _CACHE[key]
    fmt = detect_format(path)
    if fmt is not None:   # a public lengths-only trace (Azure, Mooncake, a CSV/Parquet of token counts)
        _CACHE[key] = import_trace(path, fmt)
        return _CACHE[key]
    table = _read_parquet(path)
    meta = read_metadata(table, path)
    validate_table(table, meta, path)
    steps = None
    steps_path = side_table_path(path, "steps")
    if steps_path.is_file():
        steps = _read_parquet(steps_path)
        validate_steps(steps, steps_path)
    decode_path = side_table_path(path, "decode")
    name = path.name[: -len(".parquet")] if path.name.endswith(".parquet") else path.name
    trace = Trace(name=name, path=path, table=table, metadata=meta, content_hash=trace_content_hash(table, meta),
                  steps=steps, decode_path=decode_path if decode_path.is_file() else None)
    _CACHE[key] = trace
    return trace


def trace_metadata(**fields) -> dict[bytes, bytes]:
    """Parquet key-value metadata for a new trace (writers call this)."""
    meta = {"schema_version": SCHEMA_VERSION, **fields}
    return {METADATA_KEY: json.dumps(meta, sort_keys=True).encode()}


def trace_from_arrays(name: str, prompt_tokens, output_tokens, *, max_tokens: int | None = None,
                      arrival_s=None, features: dict[str, np.ndarray] | None = None,
                      metadata: dict | None = None) -> Trace:
    """An in-memory trace (tests, synthetic workloads) validated like a file."""
    prompt_tokens = np.asarray(prompt_tokens, dtype=np.int32)
    output_tokens = np.asarray(output_tokens, dtype=np.int32)
    n = len(output_tokens)
    cap = int(max_tokens if max_tokens is not None else max(int(output_tokens.max(initial=1)), 1))
    columns = {
        "request_id": pa.array([f"r{i}" for i in range(n)], pa.string()),
        "domain": pa.array([name] * n, pa.string()),
        "prompt_id": pa.array([f"p{i}" for i in range(n)], pa.string()),
        "prompt_tokens": pa.array(prompt_tokens, pa.int32()),
        "output_tokens": pa.array(output_tokens, pa.int32()),
        "finish_reason": pa.array(["length" if o >= cap else "stop" for o in output_tokens], pa.string()),
        "max_tokens": pa.array(np.full(n, cap, dtype=np.int32), pa.int32()),
    }
    if arrival_s is not None:
        columns["arrival_s"] = pa.array(np.asarray(arrival_s, dtype=np.float64), pa.float64())
    hidden = None
    for column, matrix in (features or {}).items():
        matrix = np.asarray(matrix, dtype=np.float32)
        columns[column] = vector_array(matrix, matrix.shape[1], np.float32)
        if column != "text_embedding":
            hidden = matrix.shape[1]
    meta = {"schema_version": SCHEMA_VERSION, "hidden_size": hidden, **(metadata or {})}
    table = pa.table(columns)
    path = Path(f"<memory:{name}>")
    validate_table(table, meta, path)
    digest = hashlib.sha256(repr((name, prompt_tokens.tobytes(), output_tokens.tobytes(), cap,
                                  None if arrival_s is None else np.asarray(arrival_s).tobytes())).encode())
    vectors = features or {}
    for column in sorted(vectors):
        digest.update(np.ascontiguousarray(vectors[column], dtype=np.float32).tobytes())
    return Trace(name=name, path=None, table=table, metadata=meta, content_hash=digest.hexdigest())


def tile_trace(trace: Trace, requests: int, shuffle_seed: int | None = None) -> Trace:
    """``trace`` repeated to ``requests`` requests for scaling studies: whole copies cut to the count,
    ids suffixed ``#COPY`` (``azure-conv-000123#4``), deterministic.

    Copies follow in trace order; with recorded ``arrival_s`` each copy starts one mean gap after
    the previous copy's last arrival, so the arrival gaps repeat and the mean rate is kept. With
    ``shuffle_seed`` each copy is a permutation of the trace (fixed seed) and ``arrival_s`` is left
    out (a shuffled copy has no recorded times): the tiling the speed benchmark replays under
    Poisson arrivals. Features and every other column travel with their rows."""
    base = len(trace)
    if requests < 1:
        raise ValueError(f"tile: need at least 1 request, got {requests}")
    copies = -(-requests // base)
    copy = np.repeat(np.arange(copies, dtype=np.int64), base)[:requests]
    if shuffle_seed is None:
        rows = np.tile(np.arange(base, dtype=np.int64), copies)[:requests]
    else:
        rng = np.random.default_rng(shuffle_seed)
        rows = np.concatenate([rng.permutation(base) for _ in range(copies)])[:requests]
    table = trace.table.take(pa.array(rows))
    suffix = pc.cast(pa.array(copy), pa.string())
    ids = pc.binary_join_element_wise(table.column("request_id"), suffix, "#")
    table = table.set_column(table.column_names.index("request_id"), "request_id", ids)
    if "arrival_s" in table.column_names:
        position = table.column_names.index("arrival_s")
        own = trace.arrival_s
        if shuffle_seed is not None or own is None:
            table = table.remove_column(position)
        else:
            start = float(own.min())
            span = float(own.max()) - start
            period = span + (span / (base - 1) if base > 1 else 0.0)
            arrival = own[rows] - start + copy * period
            table = table.set_column(position, "arrival_s", pa.array(arrival, pa.float64()))
    meta = {**trace.metadata, "tiled": {"from_requests": base, "requests": requests, "shuffle_seed": shuffle_seed}}
    # valid by construction (rows of a validated trace; ids unique as (id, copy) pairs; times finite and
    # >= 0), so the validator's hash of a million ids is not paid again: tests/test_public_traces.py checks it
    digest = hashlib.sha256(f"{trace.content_hash}|tile|{requests}|{shuffle_seed}".encode()).hexdigest()
    return Trace(name=f"{trace.name}-x{requests}", path=trace.path, table=table, metadata=meta,
                 content_hash=digest, steps=trace.steps, decode_path=None)
