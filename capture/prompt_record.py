"""One prompt of a prompt set (:mod:`capture.prompts` loads them; :mod:`capture.multiturn` builds
the turns of a conversation), apart from the loaders so that both can name it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Prompt:
    domain: str
    prompt_id: str
    text: str  # user message
    keep_text: bool  # may the trace carry the text (registry-sourced sets only)
    reference: str | None = None  # the source's own reference answer, if any
    source: str = ""
    # the messages before this user turn, (role, text) each (a multi-turn source: capture/multiturn.py)
    history: tuple[tuple[str, str], ...] = ()

    def messages(self) -> list[dict]:
        """The chat messages of this request: its history, then its user turn."""
        return [{"role": r, "content": c} for r, c in self.history] + [{"role": "user", "content": self.text}]

    @property
    def request_id(self) -> str:
        return f"{self.domain}:{self.prompt_id}"
