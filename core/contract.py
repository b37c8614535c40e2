"""The names of the trace contract that every reader and writer shares, below both the trace
reader (:mod:`core.trace`) and the public-trace importers (:mod:`core.importers`)."""

from __future__ import annotations

SCHEMA_VERSION = 1
METADATA_KEY = b"leap.trace"

REQUIRED_COLUMNS: dict[str, str] = {
    "request_id": "string",
    "domain": "string",
    "prompt_id": "string",
    "prompt_tokens": "integer",
    "output_tokens": "integer",
    "finish_reason": "string",
    "max_tokens": "integer",
}


class TraceError(ValueError):
    """A trace that breaks the contract; the message names file, column and first bad row."""
