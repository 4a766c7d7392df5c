"""The README stays a short front page and every relative link in the docs leads somewhere.

Pure: reads files, no database, no network. The README is the front page (what core-jobs is,
the quickstart, the layout, links); everything else lives in docs/. A relative link must name an
existing file, and its ``#anchor``, if any, a heading of that file (GitHub's heading slugs).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

# The README's budget in bytes: about 10 KB of front page, with some slack.
README_MAX_BYTES = 12_000

# A Markdown inline link or image: [text](target) or [text](target "title").
LINK = re.compile(r"!?\[[^\]]*\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
# A repository path in backticks, as the pages name the code (`maintenance/jobs/purge/paths.py`).
REPO_PATH = re.compile(r"`(?P<path>(?:maintenance|alerts|harness|migrations|tests|bench|helm|docs)/[\w./-]+)`")
HEADING = re.compile(r"^#{1,6}[ \t]+(?P<text>.+?)[ \t#]*$", re.M)


def documents() -> list[Path]:
    """README.md and every Markdown page under docs/."""
    return [README, *sorted((ROOT / "docs").rglob("*.md"))]


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


def broken_links(path: Path) -> list[str]:
    """Every relative link of ``path`` whose file, or whose heading anchor, does not exist."""
    broken = []
    for match in LINK.finditer(without_code_blocks(path.read_text(encoding="utf-8"))):
        target = match.group("target")
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: … not ours to check
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked.read_text(encoding="utf-8")):
            broken.append(f"{target}: no heading #{anchor} in {file_part or path.name}")
    return broken


def test_readme_is_at_most_twelve_thousand_bytes():
    """README.md is the front page: at most 12 000 bytes, the rest lives in docs/."""
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes; move detail into docs/"


def test_every_relative_link_in_readme_and_docs_resolves():
    """Every relative link in README.md and docs/ points at an existing file and, with #…, an existing heading."""
    broken = {str(path.relative_to(ROOT)): links for path in documents() if (links := broken_links(path))}
    assert broken == {}, f"broken links: {broken}"


def test_link_check_reports_a_missing_file_and_a_missing_heading(tmp_path):
    """The checker flags a link to a missing file and one to a missing heading, and accepts good ones."""
    (tmp_path / "other.md").write_text("# Other\n\n## The `core-jobs serve` loop\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n[ok](other.md#the-core-jobs-serve-loop) [self](#page) [web](https://example.org/x)\n"
        "[gone](missing.md) [no heading](other.md#nowhere)\n\n```\n[in code](ignored.md)\n```\n",
        encoding="utf-8",
    )
    assert broken_links(page) == ["missing.md: no such file", "other.md#nowhere: no heading #nowhere in other.md"]


def missing_paths(path: Path) -> list[str]:
    """The repository paths ``path`` names in backticks that do not exist."""
    named = {match.group("path") for match in REPO_PATH.finditer(path.read_text(encoding="utf-8"))}
    return sorted(name for name in named if not (ROOT / name.rstrip("/")).exists())


def test_every_repository_path_named_in_readme_and_docs_exists():
    """Every `maintenance/…`, `harness/…`, `docs/…` (etc.) path README.md and docs/ name in backticks exists."""
    missing = {str(path.relative_to(ROOT)): names for path in documents() if (names := missing_paths(path))}
    assert missing == {}, f"paths that do not exist: {missing}"
