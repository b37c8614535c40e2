"""capture-traces: record real serving traces (hidden-state features + generation timings).

See ``capture.cli`` for the command line and ``docs/traces.md`` for the Parquet contract.
Heavy dependencies (torch, vllm, transformers) are imported lazily so that ``capture.cli --help``
and the input checks work in any environment.
"""

from core.errors import UsageError

__all__ = ["CaptureError"]


class CaptureError(UsageError):
    """A user-facing error: printed as one line on stderr, exit code 2 (``core.errors``)."""
