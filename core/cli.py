"""Moved to :mod:`core.errors` (the commands' one error path). Only ``live/serve.py`` still imports
it here while that file is being split; delete this module once its import names ``core.errors``."""

from core.errors import OneLineParser, run_command

__all__ = ["OneLineParser", "run_command"]
