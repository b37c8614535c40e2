"""The names of the trace contract that every reader and writer shares, below both the trace
reader (:mod:`core.trace`) and the public-trace importers (:mod:`core.importers`)."""

from __future__ import annotations

SCHEMA_VERSION = 1
#: Largest prompt_tokens / output_tokens / max_tokens a request may have: 2**20 tokens, beyond any
#: served model's context window. A larger count is a corrupt row (an int32 overflow, a sentinel
#: such as 2**31 - 1); replayed, it would run for hours, one engine step per token.
MAX_REQUEST_TOKENS = 1 << 20
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
