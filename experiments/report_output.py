"""Where ``leap-report`` writes: the output folder checked before any run, the finished report
moved into place by renames only once complete, and one progress line per run on stderr."""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

from core.checks import check_writable


class Progress:
    """One terse line on stderr per finished run (rewritten in place on a terminal)."""

    def __init__(self, total_runs: int, stream=None):
        self.total, self.done, self.started = total_runs, 0, time.monotonic()
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty()

    def say(self, text: str) -> None:
        line = f"leap-report: {text}, {time.monotonic() - self.started:.0f} s"
        if self.tty:
            self.stream.write("\r\033[K" + line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def note(self, text: str) -> None:
        """A line that stays (a skipped section), not overwritten by the next progress line."""
        self.say(text)
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()

    def run_finished(self, experiment: str, i: int, n: int) -> None:
        self.done += 1
        self.say(f"{experiment} run {i}/{n} ({self.done}/{self.total} in all)")

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def check_out(out: Path) -> None:
    """--out must be (or become) a folder in which report.md and report/ can be replaced."""
    blocker = next((p for p in [out, *out.parents] if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise ValueError(f"--out {out}: {blocker} exists and is not a folder")
    for name, folder in (("report.md", False), ("report", True)):
        path = out / name
        if path.exists() and path.is_dir() != folder:
            raise ValueError(f"--out {out}: {path} is in the way (expected a {'folder' if folder else 'file'})")
    check_writable("--out", out)
    for stale in out.glob(".leap-report-*") if out.is_dir() else ():   # stages of a killed earlier report
        shutil.rmtree(stale, ignore_errors=True)


def move_into_place(stage: Path, out: Path) -> None:
    """The new report/ and report.md replace the old ones, each by one rename, only once all is written."""
    target = out / "report"
    old = stage / "report.old"   # the stage lies inside out: same file system, renames are atomic
    if target.exists():
        os.rename(target, old)
    try:
        os.rename(stage / "report", target)
    except BaseException:
        if old.exists():
            os.rename(old, target)
        raise
    os.replace(stage / "report.md", out / "report.md")
