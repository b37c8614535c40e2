"""Remove machine-specific provenance from recorded traces' metadata, leaving every column unchanged.

Older recordings stored the recorder's local model folder (``model_path``) and a host description
that began with the host name and carried the exact kernel build. The model is already identified
by ``model_id``, ``model_revision`` (hash of the weights) and ``model_source``; the host becomes a
coarse description (CPU model, core count, OS and architecture).

    python scripts/scrub_trace_metadata.py traces/*.parquet     # rewrite in place (temp + rename)

Each file is rewritten with the same encodings as ``capture-traces repack``; the script re-reads
it and fails if any column differs from before or if the trace's content hash (which keys the
shipped weights and fit caches) changed. Side tables carry no such fields and are left alone.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from capture.store import atomic_write_table  # noqa: E402
from core.trace import METADATA_KEY, trace_content_hash  # noqa: E402

DROPPED = ("model_path",)


def coarse_host(host: str) -> str:
    """'NAME; CPU; N cpus; Linux-KERNEL-ARCH-with-LIBC' -> 'CPU; N cpus; Linux ARCH'."""
    parts = [p.strip() for p in host.split(";")]
    keep = []
    for p in parts:
        m = re.match(r"^(Linux|Darwin|Windows)-.*?(x86_64|aarch64|arm64|AMD64)", p)
        if m:
            keep.append(f"{m.group(1)} {m.group(2)}")
        elif "cpu" in p.lower() or any(w in p for w in ("AMD", "Intel", "EPYC", "Xeon", "ARM")):
            keep.append(p)
    return "; ".join(keep)


def scrub(meta: dict) -> dict:
    out = {k: v for k, v in meta.items() if k not in DROPPED}
    if isinstance(out.get("host"), str):
        out["host"] = coarse_host(out["host"])
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", nargs="+", type=Path)
    args = p.parse_args(argv)
    for path in args.traces:
        before = pq.read_table(path)
        meta = json.loads(before.schema.metadata[METADATA_KEY])
        if meta.get("table") in ("decode", "steps"):
            continue
        new = scrub(meta)
        if new == meta:
            print(f"{path}: nothing to change")
            continue
        atomic_write_table(before, path, new)
        after = pq.read_table(path)
        if not after.equals(before) or after.schema.remove_metadata() != before.schema.remove_metadata():
            raise SystemExit(f"{path}: columns differ after the rewrite")
        if trace_content_hash(after, new) != trace_content_hash(before, meta):
            raise SystemExit(f"{path}: content hash changed")
        removed = sorted(set(meta) - set(new))
        print(f"{path}: removed {', '.join(removed) or 'nothing'}; host {meta.get('host')!r} -> {new.get('host')!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
