"""Lengths-only production traces imported into the trace contract: the Azure LLM inference traces,
the Mooncake conversation trace, and any CSV or Parquet of prompt/output token counts.

Public traces carry no text and no hidden states, only when each request arrived and how many
tokens it read and wrote; that is all a replay with the oracle, the noisy oracle or FCFS needs.
Each format is one small reader returning :class:`Columns`, registered by name in
:data:`IMPORTERS`; :func:`detect_format` picks one from the file's extension and header, and
:func:`core.trace.import_trace` turns the columns into a :class:`core.trace.Trace` checked by the same
validator as a recorded trace. Parsing is vectorised (pyarrow's CSV/JSON readers, numpy), so a
million rows import in well under a second.

Conventions (the same for every format):
- ``request_id`` = ``SOURCE-ROW`` with ROW the 0-based data row of the file, zero-padded to at least
  6 digits (``azure-conv-000123``): stable, and it still names the file's row after drops;
  ``prompt_id`` = ``request_id``; ``domain`` = SOURCE (``azure-conv``, ``azure-code``,
  ``mooncake-conversation``, or the generic file's stem).
- ``arrival_s`` = seconds from the earliest request of the file (rows keep file order; the engine
  numbers requests in (arrival, row) order).
- Rows with 0 prompt tokens or 0 output tokens are dropped (a request that read or wrote nothing
  is a failed or cancelled call, with nothing to schedule); the count is kept in the metadata
  (``import.dropped_zero_tokens``) and ``simulate`` prints it. Negative, missing or fractional
  counts, and negative or non-finite times, are refused, naming the file, column and row.
- ``max_tokens`` = the largest output of the file (none of these traces records the cap its
  service used); ``finish_reason`` = ``stop`` for every row (unknown; a natural end is assumed).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from core.contract import MAX_REQUEST_TOKENS, METADATA_KEY, REQUIRED_COLUMNS, SCHEMA_VERSION, TraceError
from core.prefix_hashes import COLUMN as PREFIX_COLUMN
from core.prefix_hashes import META_KEY as PREFIX_META
from core.prefix_hashes import MOONCAKE_BLOCK, read_hash_ids
from core.rows import check_times

IMPORT_VERSION = 1
#: Generic files: accepted column names (case-insensitive), first match wins.
PROMPT_ALIASES = ("prompt_tokens", "input_length", "contexttokens", "input_tokens", "prompt_length")
OUTPUT_ALIASES = ("output_tokens", "output_length", "generatedtokens", "generated_tokens", "completion_tokens")
#: time column -> units per second (a date-time column is converted whatever its name says)
TIME_ALIASES = {"arrival_s": 1, "timestamp": 1, "arrival_time": 1, "timestamp_ms": 1000}
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length")
MOONCAKE_UNITS_PER_S = 1000   # the Mooncake traces stamp requests in milliseconds from the start


@dataclass(frozen=True)
class Columns:
    """What one format's reader hands back: raw per-row counts and times, before drops."""

    source: str                      # domain and request-id prefix
    prompt_tokens: np.ndarray        # int64, one per data row of the file
    output_tokens: np.ndarray
    arrival_s: np.ndarray | None     # float64 seconds (any origin), or None
    time_column: str | None = None   # which column the times came from (metadata)
    prefix_hashes: list | None = None   # per row, chained block hashes (core.prefix_hashes), or None
    prefix_block_size: int | None = None


def _source_of(path: Path) -> str:
    """``my_trace.csv`` -> ``my-trace``: a file stem as a domain name and id prefix."""
    return re.sub(r"[^a-z0-9]+", "-", path.stem.lower()).strip("-") or "trace"


def _counts(path: Path, table: pa.Table, column: str) -> np.ndarray:
    """A token-count column as int64; a missing, fractional or negative value is refused by row."""
    col = table.column(column)
    if len(col) == 0:   # a header alone: refused as "no requests" once the columns are together
        return np.zeros(0, np.int64)
    if col.null_count:
        row = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
        raise TraceError(f"trace {path}: column {column}: row {row}: missing value")
    if not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type)):
        raise TraceError(f"trace {path}: column {column}: expected token counts, found {col.type}")
    values = col.to_numpy()
    if pa.types.is_floating(col.type):
        bad = ~np.isfinite(values) | (values != np.round(values))
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise TraceError(f"trace {path}: column {column}: row {row}: {values[row]} is not a whole token count")
    if (values < 0).any():
        row = int(np.flatnonzero(values < 0)[0])
        raise TraceError(f"trace {path}: column {column}: row {row}: negative token count {values[row]}")
    if (values > MAX_REQUEST_TOKENS).any():   # before the cast: 2**63 would wrap to a negative int64
        row = int(np.flatnonzero(values > MAX_REQUEST_TOKENS)[0])
        count = int(values[row]) if values.dtype.kind in "iu" else f"{values[row]:.0f}"
        raise TraceError(f"trace {path}: column {column}: row {row}: {count} tokens is beyond any "
                         f"model's context (limit {MAX_REQUEST_TOKENS:,}); a corrupt value?")
    return values.astype(np.int64)


def _seconds(path: Path, table: pa.Table, column: str, per_second: int = 1) -> np.ndarray:
    """A time column as float64 seconds: date-times (any resolution) or numbers, ``per_second`` to a second."""
    col = table.column(column)
    if len(col) == 0:
        return np.zeros(0)
    if col.null_count:
        row = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
        raise TraceError(f"trace {path}: column {column}: row {row}: missing time")
    if pa.types.is_timestamp(col.type):
        ns = pc.cast(col, pa.timestamp("ns")).cast(pa.int64()).to_numpy()
        return (ns - ns.min()) / 1e9   # from the earliest: float64 keeps ns over days this way
    if pa.types.is_integer(col.type) or pa.types.is_floating(col.type):
        values = col.to_numpy().astype(np.float64) / per_second
        check_times(f"trace {path}", column, values)
        return values
    raise TraceError(f"trace {path}: column {column}: expected date-times or numbers, found {col.type} "
                     "(a value that does not parse as a date-time?)")


def _read_csv(path: Path, columns: list[str], types: dict | None = None) -> pa.Table:
    import pyarrow.csv as pacsv

    try:
        return pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(include_columns=columns,
                                                                       column_types=types or {}))
    except (OSError, pa.ArrowException) as exc:
        if isinstance(exc, pa.ArrowInvalid) and types:   # name the value's column and row
            try:
                strings = pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(
                    include_columns=columns, column_types={c: pa.string() for c in columns}))
            except (OSError, pa.ArrowException) as again:   # not the values: the rows (a field missing)
                exc = again
            else:
                _refuse_first_bad_count(path, strings, [c for c, t in types.items() if pa.types.is_integer(t)])
        raise TraceError(f"trace {path}: not a readable CSV ({str(exc).splitlines()[0]})") from None


def _refuse_first_bad_count(path: Path, strings: pa.Table, columns: list[str]) -> None:
    """The first value of ``columns`` (read as text) that is not a whole number, refused by row."""
    for column in columns:
        for row, text in enumerate(strings.column(column).to_pylist()):
            try:
                int(text)
            except (TypeError, ValueError):
                raise TraceError(f"trace {path}: column {column}: row {row}: {text!r} is not a token count") from None
            if abs(int(text)) > MAX_REQUEST_TOKENS:
                raise TraceError(f"trace {path}: column {column}: row {row}: {text} tokens is beyond any "
                                 f"model's context (limit {MAX_REQUEST_TOKENS:,}); a corrupt value?")


def _header(path: Path) -> list[str]:
    """The first line of a CSV, split on commas (quotes stripped)."""
    try:
        with open(path, encoding="utf-8-sig") as fh:
            line = fh.readline()
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"trace {path}: cannot read ({exc})") from None
    return [h.strip().strip('"') for h in line.strip().split(",")] if line.strip() else []


def read_azure(path: Path) -> Columns:
    """Azure LLM inference trace (Azure/AzurePublicDataset, 2023): ``TIMESTAMP`` (date-time with
    sub-second digits), ``ContextTokens``, ``GeneratedTokens``. ``..._conv.csv`` -> ``azure-conv``."""
    table = _read_csv(path, list(AZURE_COLUMNS), {"TIMESTAMP": pa.timestamp("ns"),
                                                  "ContextTokens": pa.int64(), "GeneratedTokens": pa.int64()})
    suffix = path.stem.rsplit("_", 1)[1].lower() if "_" in path.stem else ""
    return Columns(source=f"azure-{suffix}" if suffix.isalnum() and suffix else "azure",
                   prompt_tokens=_counts(path, table, "ContextTokens"),
                   output_tokens=_counts(path, table, "GeneratedTokens"),
                   arrival_s=_seconds(path, table, "TIMESTAMP"), time_column="TIMESTAMP")


def read_mooncake(path: Path) -> Columns:
    """Mooncake (kvcache-ai/Mooncake, FAST'25) JSON lines: ``timestamp`` in milliseconds from the
    trace's start, ``input_length``, ``output_length`` and, where given, ``hash_ids`` (the prompt's
    512-token blocks; :func:`core.prefix_hashes.read_hash_ids` chains them into ``prefix_hashes``)."""
    import pyarrow.json as pajson

    schema = pa.schema([(name, pa.float64() if name == "timestamp" else pa.int64()) for name in MOONCAKE_FIELDS])
    try:
        table = pajson.read_json(path, parse_options=pajson.ParseOptions(
            explicit_schema=schema, unexpected_field_behavior="ignore"))
    except (OSError, pa.ArrowException) as exc:
        _refuse_first_bad_record(path)
        raise TraceError(f"trace {path}: not readable JSON lines ({str(exc).splitlines()[0]})") from None
    source = _source_of(path).removesuffix("-trace")
    prompt = _counts(path, table, "input_length")
    hashes = read_hash_ids(path, prompt)
    return Columns(source=source, prompt_tokens=prompt,
                   output_tokens=_counts(path, table, "output_length"),
                   arrival_s=_seconds(path, table, "timestamp", MOONCAKE_UNITS_PER_S), time_column="timestamp",
                   prefix_hashes=hashes, prefix_block_size=MOONCAKE_BLOCK if hashes is not None else None)


def _refuse_first_bad_record(path: Path) -> None:
    """Name the first record of a JSON-lines file that pyarrow could not read: its row (0-based
    among the non-empty lines, as in the request ids) and field."""
    try:
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError):
        return
    for row, line in enumerate(lines):
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise TraceError(f"trace {path}: row {row}: not readable JSON ({exc})") from None
        if not isinstance(record, dict):
            raise TraceError(f"trace {path}: row {row}: not a JSON object")
        for name in MOONCAKE_FIELDS:
            value = record.get(name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TraceError(f"trace {path}: field {name}: row {row}: expected a number, found {value!r}")
            if name != "timestamp" and abs(value) > MAX_REQUEST_TOKENS:
                raise TraceError(f"trace {path}: field {name}: row {row}: {value} tokens is beyond any "
                                 f"model's context (limit {MAX_REQUEST_TOKENS:,}); a corrupt value?")


def _generic_names(names: list[str]) -> tuple[str | None, str | None, str | None]:
    """(prompt, output, time) column names of a generic file, matched case-insensitively."""
    lowered = {n.lower(): n for n in reversed(names)}   # the first of equal names wins
    prompt = next((lowered[a] for a in PROMPT_ALIASES if a in lowered), None)
    output = next((lowered[a] for a in OUTPUT_ALIASES if a in lowered), None)
    time = next((lowered[a] for a in TIME_ALIASES if a in lowered), None)
    return prompt, output, time


def _generic(path: Path, table: pa.Table, prompt: str, output: str, time: str | None) -> Columns:
    return Columns(source=_source_of(path), prompt_tokens=_counts(path, table, prompt),
                   output_tokens=_counts(path, table, output),
                   arrival_s=None if time is None else _seconds(path, table, time, TIME_ALIASES[time.lower()]),
                   time_column=time)


def _require_generic(path: Path, names: list[str]) -> tuple[str, str, str | None]:
    prompt, output, time = _generic_names(names)
    if prompt is None or output is None:
        raise TraceError(f"trace {path}: no prompt and output token columns (expected one of "
                         f"{'/'.join(PROMPT_ALIASES)} and one of {'/'.join(OUTPUT_ALIASES)}; "
                         f"header: {', '.join(names) or 'empty'})")
    return prompt, output, time


def read_generic_csv(path: Path) -> Columns:
    """Any CSV with a prompt-token and an output-token column (names in :data:`PROMPT_ALIASES`,
    :data:`OUTPUT_ALIASES`) and optionally a time column (:data:`TIME_ALIASES`: date-times, or
    numbers in seconds; ``timestamp_ms`` in milliseconds)."""
    prompt, output, time = _require_generic(path, _header(path))
    return _generic(path, _read_csv(path, [c for c in (prompt, output, time) if c]), prompt, output, time)


def read_generic_parquet(path: Path) -> Columns:
    """A Parquet file of token counts (not a trace of the contract): columns as for the CSV."""
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(path).names
        prompt, output, time = _require_generic(path, names)
        table = pq.read_table(path, columns=[c for c in (prompt, output, time) if c])
    except (OSError, pa.ArrowException) as exc:
        raise TraceError(f"trace {path}: not a readable Parquet file ({exc})") from None
    return _generic(path, table, prompt, output, time)


#: Every importable format by name; detection picks one (see :func:`detect_format`).
IMPORTERS: dict[str, Callable[[Path], Columns]] = {
    "azure": read_azure,
    "mooncake": read_mooncake,
    "csv": read_generic_csv,
    "parquet": read_generic_parquet,
}
IMPORT_SUFFIXES = (".csv", ".jsonl", ".json", ".parquet")


def detect_format(path: Path) -> str | None:
    """The importer for ``path`` by extension and header, or None for a Parquet trace of the
    contract (or a Parquet file that cannot be read: the trace reader names the problem)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            schema = pq.read_schema(path)
        except (OSError, pa.ArrowException):
            return None
        if METADATA_KEY in (schema.metadata or {}) or set(REQUIRED_COLUMNS) <= set(schema.names):
            return None   # a trace of the contract (one that lost its metadata is named by the reader)
        prompt, output, _ = _generic_names(schema.names)
        return "parquet" if prompt and output else None
    if suffix == ".csv":
        header = _header(path)
        if set(AZURE_COLUMNS) <= set(header):
            return "azure"
        _require_generic(path, header)
        return "csv"
    if suffix in (".jsonl", ".json"):
        try:
            with open(path, encoding="utf-8") as fh:
                first = json.loads(fh.readline() or "null")
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise TraceError(f"trace {path}: first line is not a JSON object ({exc})") from None
        if isinstance(first, dict) and set(MOONCAKE_FIELDS) <= set(first):
            return "mooncake"
        keys = ", ".join(first) if isinstance(first, dict) else type(first).__name__
        raise TraceError(f"trace {path}: not a Mooncake trace (expected fields {', '.join(MOONCAKE_FIELDS)}; "
                         f"first line has {keys})")
    return None


def _string_ids(prefix: str, numbers: np.ndarray, width: int) -> pa.Array:
    """``PREFIX-000123`` for each number, built in Arrow (no Python loop)."""
    digits = pc.utf8_lpad(pc.cast(pa.array(numbers, pa.int64()), pa.string()), width, "0")
    return pc.binary_join_element_wise(pa.scalar(prefix), digits, "")


def constant_strings(value: str, n: int) -> pa.Array:
    """A string column of ``n`` copies of ``value`` (dictionary decode: no Python objects)."""
    return pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array([value])).cast(pa.string())


@dataclass(frozen=True)
class ImportedTable:
    """A public trace's requests as a table of the contract, before validation (which the trace
    reader does: :func:`core.trace.import_trace`)."""

    name: str
    path: Path
    table: pa.Table
    metadata: dict
    content_hash: str


def columns_to_table(path: Path, fmt: str, cols: Columns) -> ImportedTable:
    """Apply the conventions of the module docstring (drops, ids, times from the first request,
    cap)."""
    total = len(cols.prompt_tokens)
    if total == 0:
        raise TraceError(f"trace {path}: has no requests")
    keep = (cols.prompt_tokens > 0) & (cols.output_tokens > 0)
    rows = np.flatnonzero(keep)
    if len(rows) == 0:
        raise TraceError(f"trace {path}: every one of its {total} rows has 0 prompt or 0 output tokens")
    prompt, output = cols.prompt_tokens[rows], cols.output_tokens[rows]
    n, cap = len(rows), int(output.max())
    ids = _string_ids(f"{cols.source}-", rows, max(6, len(str(total - 1))))
    columns = {
        "request_id": ids,
        "domain": constant_strings(cols.source, n),
        "prompt_id": ids,
        "prompt_tokens": pa.array(prompt, pa.int64()),
        "output_tokens": pa.array(output, pa.int64()),
        "finish_reason": constant_strings("stop", n),
        "max_tokens": pa.array(np.full(n, cap, np.int64)),
    }
    arrival = None
    if cols.arrival_s is not None:
        arrival = cols.arrival_s[rows] - float(cols.arrival_s[rows].min())
        columns["arrival_s"] = pa.array(arrival, pa.float64())
    dropped = total - n
    meta = {"schema_version": SCHEMA_VERSION, "lengths_only": True,
            "import": {"format": fmt, "file": path.name, "source": cols.source, "rows": total,
                       "dropped_zero_tokens": dropped, "time_column": cols.time_column,
                       "max_tokens": "largest output of the file", "version": IMPORT_VERSION}}
    digest = hashlib.sha256(f"leap.trace.import/{IMPORT_VERSION}|{fmt}|{cols.source}|{total}|{cap}|".encode())
    if cols.prefix_hashes is not None:   # prefix identity (docs/traces.md "Prefix hashes")
        kept = [cols.prefix_hashes[r] for r in rows.tolist()]
        columns[PREFIX_COLUMN] = pa.array(kept, pa.list_(pa.int64()))
        meta[PREFIX_META] = cols.prefix_block_size
        digest.update(f"{PREFIX_META}={cols.prefix_block_size}|".encode())
        digest.update(np.asarray([h for chain in kept for h in chain] + [len(c) for c in kept], np.int64).tobytes())
    table = pa.table(columns)
    for array in (rows, prompt, output) + (() if arrival is None else (arrival,)):
        digest.update(np.ascontiguousarray(array).tobytes())
    name = path.name.rsplit(".", 1)[0]
    return ImportedTable(name=name, path=path, table=table, metadata=meta, content_hash=digest.hexdigest())


def import_table(path: str | Path, fmt: str | None = None) -> ImportedTable:
    """Read a public trace file into the contract's columns (format detected unless given).
    Raises :class:`TraceError` with one line naming the file and the problem."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"trace {path}: no such file")
    fmt = fmt or detect_format(path)
    if fmt not in IMPORTERS:
        raise TraceError(f"trace {path}: not an importable format (known: {', '.join(IMPORTERS)}; by extension "
                         f"{', '.join(IMPORT_SUFFIXES)})")
    return columns_to_table(path, fmt, IMPORTERS[fmt](path))
