"""Same seed, same bytes, whatever numpy: a reduced ``leap-report`` run here and under another numpy
release (a fresh venv in a temporary folder, the light dependencies from PyPI, this checkout on
PYTHONPATH), and every output file compared byte for byte.

    python scripts/check_numpy_versions.py                  # the other of numpy 2.3.5 / latest 2.4
    python scripts/check_numpy_versions.py --numpy 2.4.6 --keep /tmp/np-check

The report's runs cover every predictor and policy of the bundled traces, both kernels' float rules
(the other venv has no numba, so it also runs the reference engine against this one's compiled
kernel where numba is here) and the metrics. Exit 0: identical; 1: the files that differ; 2: the
other venv could not be built (e.g. no package index), with the reason. CI cost: a venv with
numpy, pyarrow, simpy, rich and matplotlib (16 CPU-s from a local package index) and two reduced
reports, one process each (21 CPU-s here with numba's cache warm, 32 under the other numpy): about
70 CPU-s in all, measured at load average 3 on two cores (with two workers per report: 125).
"""

from __future__ import annotations

import argparse
import filecmp
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIGHT = ["simpy>=4.1", "pyarrow>=16", "rich>=13", "matplotlib>=3.7"]
#: one process each (--jobs 1): the bytes are the same as with a pool (checked), at a third of the CPU
#: here (with 2 workers each loaded every rule's kernel: 68.6 against 21.0 CPU-s, warm numba cache)
REPORT = ["--requests", "200", "--loads", "1,2", "--jobs", "1", "--seed", "0"]


def other_numpy(current: str) -> str:
    """The release to compare with: 2.3.5 from a 2.4 (or later) venv, else the latest 2.4."""
    major, minor = (int(x) for x in current.split(".")[:2])
    return "numpy==2.3.5" if (major, minor) >= (2, 4) else "numpy>=2.4,<2.5"


def run_report(python: str, out: Path, env: dict) -> None:
    code = "from experiments.entry import leap_report; leap_report()"
    done = subprocess.run([python, "-c", code, *REPORT, "--out", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"check_numpy_versions: leap-report under {python} failed: {done.stderr.strip()[-2000:]}")


def differing(a: Path, b: Path) -> list[str]:
    files = {p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file()}
    files |= {p.relative_to(b).as_posix() for p in b.rglob("*") if p.is_file()}
    return sorted(f for f in files if not ((a / f).is_file() and (b / f).is_file()
                                           and filecmp.cmp(a / f, b / f, shallow=False)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--numpy", help="the other numpy requirement (default: the other of 2.3.5 / 2.4)")
    ap.add_argument("--keep", type=Path, help="work folder kept afterwards (default: a temporary one)")
    args = ap.parse_args(argv)
    import numpy

    spec = f"numpy=={args.numpy}" if args.numpy and args.numpy[0].isdigit() else (args.numpy or other_numpy(numpy.__version__))
    work = args.keep or Path(tempfile.mkdtemp(prefix="numpy-check-"))
    work.mkdir(parents=True, exist_ok=True)
    venv = work / "venv"
    python = str(venv / "bin" / "python")
    if not Path(python).exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", spec, *LIGHT],
                         capture_output=True, text=True)
    if pip.returncode != 0:
        print(f"check_numpy_versions: could not install {spec}: {pip.stderr.strip().splitlines()[-1:]}",
              file=sys.stderr)
        return 2
    other = subprocess.run([python, "-c", "import numpy; print(numpy.__version__)"], capture_output=True,
                           text=True, check=True).stdout.strip()
    env = dict(os.environ, PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
               MKL_NUM_THREADS="1")
    for name, py in (("here", sys.executable), ("other", python)):   # own caches: nothing measured is shared
        run_report(py, work / name, dict(env, LEAP_CACHE_DIR=str(work / f"cache-{name}")))
    diff = differing(work / "here", work / "other")
    if diff:
        print(f"check_numpy_versions: numpy {numpy.__version__} and {other} differ in {len(diff)} files: "
              + ", ".join(diff), file=sys.stderr)
        return 1
    print(f"check_numpy_versions: numpy {numpy.__version__} and {other}: the reduced report is byte-identical "
          f"({sum(1 for p in (work / 'here').rglob('*') if p.is_file())} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
