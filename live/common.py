"""Names every live module shares (below both the config and the read-out file it checks)."""

from __future__ import annotations

#: The one feature the live hook captures: the tapped layer's state at the last prompt token.
HOOK_FEATURE = "feat_last"


class LiveConfigError(ValueError):
    """A live-scheduler setting vLLM cannot honour (printed as one line, exit 2)."""
