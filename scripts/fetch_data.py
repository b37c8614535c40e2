"""Fetch the shared data (prompt sets, arrival traces) from their public sources and check each
file against the sha256 committed in ``scripts/shared_data.tsv``.

    python scripts/fetch_data.py                 # download what is missing into ../shared/data, check all
    python scripts/fetch_data.py --check         # no network: check the files already there

A file is written only once its bytes match the committed hash (a moved upstream branch is reported,
never saved). Rows built ``manual`` have no rebuild from a public file: the script names the source.
Exit 0 when every file is present and matches, 1 when one is missing or differs, 2 on bad input.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
MANIFEST = CHECKOUT / "scripts" / "shared_data.tsv"
COLUMNS = ("path", "sha256", "bytes", "build", "licence", "url")


@dataclass(frozen=True)
class Entry:
    path: str
    sha256: str
    bytes: int
    build: str
    licence: str
    url: str


def read_manifest(path: Path = MANIFEST) -> list[Entry]:
    """The committed list; a malformed row is refused naming its line."""
    entries = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) != len(COLUMNS) or len(fields[1]) != 64 or not fields[2].isdigit() \
                or fields[3] not in ("copy", "manual"):
            raise ValueError(f"{path.name} line {number}: expected {' <TAB> '.join(COLUMNS)}")
        entries.append(Entry(fields[0], fields[1], int(fields[2]), fields[3], fields[4], fields[5]))
    return entries


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def problem(entry: Entry, dest: Path) -> str | None:
    """Why ``entry`` is not in place under ``dest`` (None: present with the committed bytes)."""
    file = dest / entry.path
    if not file.is_file():
        return "missing"
    got = sha256(file)
    return None if got == entry.sha256 else f"sha256 {got[:16]}, expected {entry.sha256[:16]}"


def fetch(entry: Entry, dest: Path) -> str | None:
    """Download one file; it is kept only if its bytes match. Returns what went wrong, or None."""
    if entry.build == "manual":
        return f"not rebuilt from a public file; source: {entry.url} (see ../shared/data/README.md)"
    target = dest / entry.path
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".part")
    try:
        with urllib.request.urlopen(entry.url, timeout=60) as response, partial.open("wb") as out:
            for block in iter(lambda: response.read(1 << 20), b""):
                out.write(block)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        return f"download failed ({exc}) from {entry.url}"
    got = sha256(partial)
    if got != entry.sha256:
        partial.unlink()
        return f"downloaded sha256 {got[:16]} differs from the committed {entry.sha256[:16]} ({entry.url})"
    os.replace(partial, target)
    return None


def default_dest() -> Path:
    return Path(os.environ.get("LEAP_DATA_DIR") or CHECKOUT.parent / "shared" / "data")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fetch_data.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", type=Path, default=None,
                        help="data folder (default: $LEAP_DATA_DIR, else <checkout>/../shared/data)")
    parser.add_argument("--check", action="store_true", help="only check the files there (no network)")
    args = parser.parse_args(argv)
    dest = args.dest if args.dest is not None else default_dest()
    if args.check and not dest.is_dir():
        print(f"fetch_data.py: --dest {dest}: no such folder", file=sys.stderr)
        return 2
    bad = 0
    for entry in read_manifest():
        why = problem(entry, dest)
        if why is not None and not args.check:
            why = fetch(entry, dest)
        if why is not None:
            bad += 1
            print(f"{entry.path}: {why}", file=sys.stderr)
    entries = len(read_manifest())
    print(f"fetch_data.py: {entries - bad} of {entries} files in {dest} match scripts/shared_data.tsv")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
