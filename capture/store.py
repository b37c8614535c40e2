"""Crash-safe chunked storage of a trace being recorded, and the final atomic write.

Layout while recording ``OUT = traces/NAME.parquet``::

    traces/NAME.parquet.parts/config.json         run configuration (checked on --resume)
    traces/NAME.parquet.parts/gen-RRR-SSSSS.parquet   finished requests (generation + feat_last)
    traces/NAME.parquet.parts/dec-RRR-SSSSS.parquet   decode-feature rows of those requests
    traces/NAME.parquet.parts/steps-RRR-SSSSS.parquet engine steps
    traces/NAME.parquet.parts/feat-RRR-SSSSS.parquet  prefill-pass features (feat_mean, ...)

Every part is written to a temporary name and renamed, so a kill leaves only whole parts.  A
request counts as done once its ``gen`` row exists; decode rows are written *before* the gen part
and rows of requests without a gen row are dropped when reading, so nothing is lost or duplicated.
``finalize`` writes ``NAME.decode.parquet``, ``NAME.steps.parquet`` and then ``NAME.parquet``
(each atomically: ``core.io``) and removes the parts folder.  A later run with ``--resume`` on a finished
trace seeds a new parts folder from the final files, so a trace can also be extended.
"""

from __future__ import annotations

import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from core.io import atomic_write_bytes, atomic_write_parquet
from core.trace import METADATA_KEY, side_table_path

from . import CaptureError

KINDS = ("gen", "dec", "steps", "feat")


def check_output_flags(args) -> None:
    """Output flags that contradict each other, refused before the model is even looked at."""
    if args.resume and args.overwrite:
        raise CaptureError("--resume and --overwrite contradict each other (continue the recording, or "
                           "replace it): give one")
    if args.finalize_partial and not args.resume:
        raise CaptureError("--finalize-partial needs --resume (it finishes the recording --out holds)")


def check_output_trace(out: Path, what: str) -> None:
    """Before anything runs: ``out`` names a .parquet file whose folder exists and is writable,
    and neither it nor its side tables' paths is a folder."""
    if not out.name.endswith(".parquet"):
        raise CaptureError(f"{what} must name a .parquet file: {out}")
    if not out.parent.is_dir():
        raise CaptureError(f"output folder does not exist: {out.parent}")
    for target in (out, side_table_path(out, "decode"), side_table_path(out, "steps")):
        if target.is_dir():
            raise CaptureError(f"{what}: {target} is a folder")
    if not os.access(out.parent, os.W_OK):
        raise CaptureError(f"output folder is not writable: {out.parent}")


def atomic_write_table(table: pa.Table, path: Path, metadata: dict | None = None) -> None:
    """A trace file (or side table) with its ``leap.trace`` metadata, in the trace encodings."""
    if metadata is not None:
        md = dict(table.schema.metadata or {})
        md[METADATA_KEY] = json.dumps(metadata, sort_keys=True).encode()
        table = table.replace_schema_metadata(md)
    atomic_write_parquet(Path(path), table, **write_options(table.schema))


def write_options(schema: pa.Schema) -> dict:
    """zstd; dictionaries only for strings (they bloat float vectors by ~20 %); byte-stream-split
    for every float list (token times: 5.5 instead of 9 bytes a token; float16/float32 vectors
    5-7 % smaller, since the exponent bytes then compress apart from the noisy mantissas)."""
    dict_cols, bss = [], {}
    for f in schema:
        if pa.types.is_string(f.type) or pa.types.is_large_string(f.type):
            dict_cols.append(f.name)
        elif (pa.types.is_list(f.type) or pa.types.is_fixed_size_list(f.type)) and \
                pa.types.is_floating(f.type.value_type):
            bss[f"{f.name}.list.element"] = "BYTE_STREAM_SPLIT"
    return {"compression": "zstd", "use_dictionary": dict_cols or False,
            "column_encoding": bss or None}


def repack(path: Path) -> None:
    """Rewrite a finished trace file with the current encodings (content and metadata unchanged)."""
    try:
        t = pq.read_table(path)
    except (OSError, pa.ArrowException) as e:
        raise CaptureError(f"cannot read {path} as Parquet: {str(e).splitlines()[0]}") from None
    try:
        atomic_write_parquet(Path(path), t, **write_options(t.schema))
    except (OSError, pa.ArrowException) as e:
        raise CaptureError(f"cannot rewrite {path}: {e.strerror if isinstance(e, OSError) and e.strerror else e}") from None


class PartStore:
    def __init__(self, out: Path):
        self.out = Path(out)
        self.dir = self.out.with_name(self.out.name + ".parts")
        self.run = 0
        self.seq = 0

    # -------------------------------------------------------------- locking
    def lock(self) -> None:
        """Hold an exclusive lock for this output for the life of the process (released by the OS
        on exit or kill), so that two recorders, or a recorder and --finalize-partial, never
        work on the same trace at once."""
        import fcntl
        import hashlib

        base = Path(os.environ.get("LEAP_LOCK_DIR", Path.home() / ".cache" / "leap-sched" / "locks"))
        base.mkdir(parents=True, exist_ok=True)
        key = hashlib.sha256(str(self.out.resolve()).encode()).hexdigest()[:16]
        self._lockf = open(base / f"{key}.lock", "w")
        try:
            fcntl.flock(self._lockf.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise CaptureError(f"another capture-traces process is recording {self.out}") from None
        self._lockf.write(f"{os.getpid()} {self.out}\n")
        self._lockf.flush()

    # -------------------------------------------------------------- lifecycle
    def discard(self) -> None:
        """Remove the parts folder (a run that failed before recording anything)."""
        shutil.rmtree(self.dir, ignore_errors=True)

    def exists(self) -> bool:
        return self.dir.is_dir() or self.out.exists()

    @contextmanager
    def segment(self, config: dict, resume: bool):
        """Open (:meth:`open`) and record one segment: a new recording that fails before its first
        row leaves no parts folder behind (which would make a plain rerun ask for --resume). Every
        recorder (``capture-traces``, ``leap-serve`` in process and through a server) records so."""
        fresh = not self.exists()
        self.open(config, resume=resume)
        try:
            yield self
        except BaseException:
            if fresh and self.dir.is_dir() and not self.done_ids("gen") and not self.done_ids("feat"):
                self.discard()
            raise

    def open(self, config: dict, resume: bool) -> None:
        """Create or reopen the parts folder; on resume check the configuration matches."""
        stem = self.out.name[: -len(".parquet")] if self.out.name.endswith(".parquet") else self.out.name
        for pattern in (f".{stem}.*.tmp", f".{stem}.*.tmp-*"):   # left by a kill during finalize
            for tmp in self.out.parent.glob(pattern):               # (the second: older versions)
                tmp.unlink(missing_ok=True)
        if not resume:
            if self.dir.exists():
                shutil.rmtree(self.dir)
            self.dir.mkdir(parents=True)
            self._write_config(config)
            return
        if not self.dir.is_dir():
            if self.out.exists():
                self._seed_from_final(config)
            else:
                self.dir.mkdir(parents=True)
                self._write_config(config)
                return
        old = json.loads((self.dir / "config.json").read_text())
        diffs = [k for k in sorted(set(old) | set(config)) if old.get(k) != config.get(k)]
        if diffs:
            k = diffs[0]
            raise CaptureError(
                f"--resume: {self.out} was recorded with {k}={old.get(k)!r}, now {config.get(k)!r}; "
                "use the same settings or another --out"
            )
        runs = [int(p.name.split("-")[1]) for p in self.dir.glob("*-*-*.parquet")]
        runs += [int(p.stem.split("-")[1]) for p in self.dir.glob("run-*.json")]
        prev = self.dir / "runs_prev.json"
        if prev.exists():
            runs += [int(r.get("run", 0)) for r in json.loads(prev.read_text())]
        self.run = max(runs) + 1 if runs else 0

    def _write_config(self, config: dict) -> None:
        atomic_write_bytes(self.dir / "config.json", json.dumps(config, sort_keys=True, indent=1).encode())

    def _seed_from_final(self, config: dict) -> None:
        meta = read_meta(self.out)
        old = meta.get("run_config") or {}
        diffs = [k for k in sorted(set(old) | set(config)) if old.get(k) != config.get(k)]
        if diffs:
            k = diffs[0]
            raise CaptureError(
                f"--resume: {self.out} was recorded with {k}={old.get(k)!r}, now {config.get(k)!r}"
            )
        tmpdir = self.dir.with_name(self.dir.name + ".seed")
        if tmpdir.exists():
            shutil.rmtree(tmpdir)
        tmpdir.mkdir(parents=True)
        t = pq.read_table(self.out)
        t = t.replace_schema_metadata(None)
        featcols = [c for c in meta.get("prefill_pass_columns", []) if c in t.column_names]
        gen = t.drop_columns(featcols)
        pq.write_table(gen, tmpdir / "gen-000-00000.parquet")
        if featcols:
            pq.write_table(t.select(["request_id", *featcols]), tmpdir / "feat-000-00000.parquet")
        for kind, name in (("dec", "decode"), ("steps", "steps")):
            sp = side_table_path(self.out, name)
            if sp.exists():
                pq.write_table(pq.read_table(sp).replace_schema_metadata(None),
                               tmpdir / f"{kind}-000-00000.parquet")
        (tmpdir / "config.json").write_text(json.dumps(config, sort_keys=True, indent=1))
        backend = dict(meta.get("backend_details") or {})
        backend.update({k: meta.get(k) for k in ("backend", "backend_version", "eager")})
        (tmpdir / "backend.json").write_text(json.dumps(backend))
        (tmpdir / "runs_prev.json").write_text(json.dumps(meta.get("runs") or []))
        (tmpdir / "crosscheck_prev.json").write_text(json.dumps(meta.get("feat_last_crosscheck") or {}))
        os.replace(tmpdir, self.dir)
        self.run = 1 + max([r.get("run", 0) for r in meta.get("runs") or []] + [0])

    # -------------------------------------------------------------- writing
    def write(self, kind: str, table: pa.Table) -> None:
        assert kind in KINDS
        if table.num_rows == 0:
            return
        name = f"{kind}-{self.run:03d}-{self.seq:05d}.parquet"
        self.seq += 1
        atomic_write_parquet(self.dir / name, table, compression="snappy")

    # -------------------------------------------------------------- reading
    def read(self, kind: str) -> pa.Table | None:
        files = sorted(self.dir.glob(f"{kind}-*-*.parquet"))
        if not files:
            return None
        tables = [pq.read_table(f) for f in files]
        return pa.concat_tables(tables, promote_options="permissive")

    def done_ids(self, kind: str) -> set[str]:
        files = sorted(self.dir.glob(f"{kind}-*-*.parquet"))
        ids: set[str] = set()
        for f in files:
            ids.update(pq.read_table(f, columns=["request_id"]).column(0).to_pylist())
        return ids

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def dedupe_first(table: pa.Table, keys: list[str]) -> pa.Table:
    seen = set()
    keep = []
    cols = [table.column(k).to_pylist() for k in keys]
    for i, key in enumerate(zip(*cols)):
        if key not in seen:
            seen.add(key)
            keep.append(i)
    if len(keep) == table.num_rows:
        return table
    return table.take(pa.array(keep, type=pa.int64()))


def read_meta(path: Path) -> dict:
    try:
        md = pq.read_schema(path).metadata or {}
    except Exception as e:  # noqa: BLE001
        raise CaptureError(f"cannot read {path}: {e}") from None
    raw = md.get(METADATA_KEY)
    if raw is None:
        raise CaptureError(f"{path}: no leap.trace metadata")
    return json.loads(raw)
