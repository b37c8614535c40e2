"""Console tables that fit the terminal: columns are dropped in a stated order, never cut.

A results table is read on whatever terminal the user has, often 80 columns. Rich shrinks a table
that is too wide by cutting its cells ("0.07…"), which turns a figure into a wrong one. Here a
table is built with the columns kept so far and rendered off-screen first; while that rendering
cuts a cell (rich marks every cut with "…") or runs past the width, the next column of the
caller's drop order goes (headers may still wrap at their spaces). ``wide`` keeps every column and
widens the console to the table instead (the terminal then wraps whole lines, which cuts nothing).

The width is ``$COLUMNS`` when set (as shells export it), else the terminal's when stdout is
one, else the caller's default (output piped to a file or another program).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Sequence
from typing import Any


def output_width(default: int) -> int:
    """Columns to fit: ``$COLUMNS``, else the terminal's width, else ``default``."""
    text = os.environ.get("COLUMNS", "").strip()
    if text.isdigit() and int(text) > 0:
        return int(text)
    if sys.stdout.isatty():
        return shutil.get_terminal_size((default, 24)).columns
    return default


def header_lines(parts: Sequence[str], width: int, sep: str = " | ") -> list[str]:
    """``parts`` joined by ``sep`` into lines of at most ``width`` characters, broken only between
    parts (a part longer than the width gets a line of its own)."""
    lines: list[str] = []
    for part in parts:
        if lines and len(lines[-1]) + len(sep) + len(part) <= width:
            lines[-1] += sep + part
        else:
            lines.append(part)
    return lines


def fitted_table(build: Callable[[list[str]], Any], columns: Sequence[str], drop_order: Sequence[str],
                 width: int, wide: bool = False) -> tuple[Any, int, list[str]]:
    """(table, console width, dropped columns): ``build(kept)`` makes a rich Table of the columns
    ``kept`` (in ``columns`` order); columns of ``drop_order`` go, first to last, until the table
    renders within ``width`` with every cell whole. ``wide``: nothing is dropped, and the console
    width grows to the table's natural width."""
    from rich.console import Console

    kept = list(columns)
    dropped: list[str] = []
    table = build(kept)
    if wide:
        return table, max(width, Console(width=10_000).measure(table).maximum), dropped
    for name in drop_order:
        if _renders_whole(table, width):
            break
        if name in kept:
            kept.remove(name)
            dropped.append(name)
            table = build(kept)
    return table, width, dropped


def _renders_whole(table: Any, width: int) -> bool:
    """The table printed at ``width`` cuts no cell and no line runs past the width."""
    import io

    from rich.console import Console

    buffer = io.StringIO()
    Console(width=width, file=buffer, color_system=None).print(table)
    text = buffer.getvalue()
    return "\u2026" not in text and all(len(line) <= width for line in text.splitlines())


def stdout_console(width: int) -> Any:
    """A rich Console on stdout whose closed pipe (``simulate ... | head -1``) raises
    ``BrokenPipeError``, which :func:`core.errors.run_command` ends quietly with status 141 as a
    shell reports SIGPIPE (rich's own handler exits with status 1)."""
    from rich.console import Console

    class PipeConsole(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError("stdout closed by its reader")

    return PipeConsole(width=width, highlight=False)
