"""Every relative link in the project's Markdown resolves: the file exists and, for ``#anchor``,
the target holds a heading with that anchor (GitHub's rule: lower case, punctuation dropped,
spaces to hyphens, ``-1``, ``-2`` for repeats). Links inside code are not links."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted(p for p in ROOT.rglob("*.md") if not any(part.startswith(".") for part in p.relative_to(ROOT).parts))
FENCED = re.compile(r"^ *```.*?^ *```", re.S | re.M)
CODE = re.compile(FENCED.pattern + r"|`[^`\n]*`", re.S | re.M)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for match in re.finditer(r"^#{1,6} +(.+?) *#*$", FENCED.sub("", doc.read_text()), re.M):
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(doc: Path) -> list[str]:
    return [t for t in LINK.findall(CODE.sub("", doc.read_text())) if not re.match(r"[a-z]+:", t)]


def test_slug_follows_githubs_rule():
    assert slug("Decision-level equality with a real vLLM: step-clocked live runs") == \
        "decision-level-equality-with-a-real-vllm-step-clocked-live-runs"
    assert slug("Serving runs as clients see them (`leap-serve --server URL`)") == \
        "serving-runs-as-clients-see-them-leap-serve---server-url"
    assert slug("Re-timed: where LEAP's time goes") == "re-timed-where-leaps-time-goes"


def test_the_docs_hold_links():
    assert sum(len(links(d)) for d in DOCS) >= 20


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_relative_links_resolve(doc):
    broken = []
    for target in links(doc):
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            broken.append(f"{target}: no file {path}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(ROOT)}")
    assert not broken, f"{doc.relative_to(ROOT)}: " + "; ".join(broken)
