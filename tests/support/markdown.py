"""Reading Markdown as GitHub renders it: headings' anchors, without the fenced code blocks."""

from __future__ import annotations

import re

FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
HEADING = re.compile(r"^#{1,6}[ \t]+(?P<text>.+?)[ \t#]*$", re.M)


def without_code_blocks(text: str) -> str:
    """``text`` with its fenced code blocks removed: a link-like string in code is not a link."""
    return FENCE.sub("", text)


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives the headings of ``text``: lower case, punctuation dropped, spaces as hyphens."""
    found: set[str] = set()
    for match in HEADING.finditer(without_code_blocks(text)):
        slug = re.sub(r"[^\w\- ]", "", match.group("text").strip().lower()).replace(" ", "-")
        candidate, n = slug, 0
        while candidate in found:
            n += 1
            candidate = f"{slug}-{n}"
        found.add(candidate)
    return found
