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

from core.contract import METADATA_KEY, SCHEMA_VERSION, TraceError
from core.importers import detect_format, import_table
from core.io import shareable_path
from core.rows import check_vectors
from core.trace_checks import (
    FEATURE_COLUMNS as FEATURE_COLUMNS,  # re-exported: the contract's import path
)
from core.trace_checks import (
    _read_parquet,
    _require_columns,
    read_metadata,
    trace_content_hash,
    validate_steps,
    validate_table,
    vector_array,
    vectors_to_numpy,
)

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
    if shuffle_seed is None:   # whole copies share the trace's buffers (a million rows of features are not copied)
        full, rest = divmod(requests, base)
        table = pa.concat_tables([trace.table] * full + ([trace.table.slice(0, rest)] if rest else []))
    else:
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
