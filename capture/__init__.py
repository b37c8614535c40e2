"""capture-traces: record real serving traces (hidden-state features + generation timings).

See ``capture.cli`` for the command line and ``shared/spec/traces.md`` for the Parquet contract.
Heavy dependencies (torch, vllm, transformers) are imported lazily so that ``capture.cli --help``
and the input checks work in any environment.
"""

__all__ = ["CaptureError"]


class CaptureError(Exception):
    """A user-facing error: printed as one line on stderr, exit code 2."""
