"""The README stays a short front page, every relative link in the docs leads somewhere, and every
module path the docs and the code's docstrings and comments name still imports (nothing left
behind by a move).

Pure: reads files, no database, no network. The README is the front page (what core-jobs is,
the quickstart, the layout, links); everything else lives in docs/. A relative link must name an
existing file, and its ``#anchor``, if any, a heading of that file (GitHub's heading slugs).
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from support import ROOT
from support.markdown import anchors, without_code_blocks

from tools import reference

README = ROOT / "README.md"

# The README's budget in bytes: about 10 KB of front page, with some slack.
README_MAX_BYTES = 12_000

# A Markdown inline link or image: [text](target) or [text](target "title").
LINK = re.compile(r"!?\[[^\]]*\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
# A repository path in backticks, as the pages name the code (`maintenance/jobs/purge/paths.py`).
REPO_PATH = re.compile(r"`(?P<path>(?:maintenance|alerts|harness|migrations|tests|bench|helm|docs)/[\w./-]+)`")


def documents() -> list[Path]:
    """README.md and every Markdown page under docs/."""
    return [README, *sorted((ROOT / "docs").rglob("*.md"))]


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


# A dotted module path in prose or a comment (``maintenance.jobs.purge.job.Purger``); not a file
# name (``bench/harness.py``, ``docs/alerts.md``), which the lookbehind and FILE_SUFFIXES skip.
DOTTED = re.compile(r"(?<![\w/.-])(?P<name>(?:maintenance|alerts|harness|migrations)(?:\.[A-Za-z_]\w*)+)")
FILE_SUFFIXES = ("md", "toml", "yaml", "json", "txt")
# The made-up job of docs/adding-a-job.md's example, which does not exist on purpose.
MADE_UP = ("maintenance.backlog", "maintenance.jobs.backlog")


def prose_files() -> list[Path]:
    """Where the code is named for people: README, docs/, the code's docstrings and comments, bench/, packaging."""
    code = [
        p
        for package in ("maintenance", "alerts", "harness", "migrations", "bench")
        for p in (ROOT / package).rglob("*.py")
    ]
    return [
        *documents(),
        *sorted(code),
        ROOT / "pyproject.toml",
        ROOT / "harness" / "pyproject.toml",
        ROOT / "Dockerfile",
    ]


def resolves(dotted: str) -> bool:
    """Whether ``dotted`` is an importable module, or an attribute path inside one."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attribute in parts[i:]:
            if not hasattr(obj, attribute):
                return False
            obj = getattr(obj, attribute)
        return True
    return False


def unresolved_names(path: Path, events: set[str]) -> list[str]:
    """The dotted module paths ``path`` names that neither import nor are (a prefix of) a log event's name."""
    bad = set()
    for match in DOTTED.finditer(path.read_text(encoding="utf-8")):
        name = match.group("name")
        if name.rsplit(".", 1)[-1] in FILE_SUFFIXES or name.startswith(MADE_UP):
            continue
        if name in events or any(event.startswith(name + ".") for event in events):
            continue
        if not resolves(name.removesuffix(".py")):
            bad.add(name)
    return sorted(bad)


def test_every_module_path_named_in_docs_and_code_resolves():
    """Every `maintenance.…`, `alerts.…`, `harness.…` path in the docs, docstrings and comments imports, or is a log event."""
    events = set(reference.collect_events())
    bad = {str(p.relative_to(ROOT)): names for p in prose_files() if (names := unresolved_names(p, events))}
    assert bad == {}, f"module paths that do not exist (moved?): {bad}"


def test_module_path_check_reports_a_moved_name(tmp_path):
    """The checker flags a path that no longer imports and accepts a live one, an event name and a file name."""
    page = tmp_path / "page.md"
    page.write_text(
        "old ``maintenance.purge.Purger``, new ``maintenance.jobs.purge.job.Purger``,"
        " event `maintenance.purge.stop`, file `bench/harness.py`\n",
        encoding="utf-8",
    )
    assert unresolved_names(page, {"maintenance.purge.stop"}) == ["maintenance.purge.Purger"]


# Ticket history in production code: "issue 12", "issues 3", "seed 002". Requirement ids (R-2,
# J-B7, NF-13) say the same thing and resolve in docs/spec.md; the spec and the docs pages may
# tell the history, the code says why.
TICKET = re.compile(r"\b(?:issues?\s+\d+|seed\s+\d{3})\b", re.I)
PRODUCTION = ("maintenance", "alerts", "harness", "migrations")
# A table's or column's comment is stored in the database (pg_description): rewording one is a
# schema change, which needs a migration of its own. These migrations wrote theirs before the
# rule; a later migration that restates a comment may drop the ticket then. No new one may.
STORED_COMMENT = re.compile(r"COMMENT ON\b[^;']*?\bIS\s*'(?:[^']|'')*'", re.S)
COMMENTS_STORED_BEFORE_THE_RULE = {
    f"migrations/versions/{name}.py"
    for name in (
        "0001_foundation",
        "0002_alerts",
        "0003_harness",
        "0006_alert_identity",
        "0009_operations_api",
        "0010_durable_actions",
        "0011_execution_alerts",
        "0012_execution_resolution",
        "0015_installation_copies",
        "0016_installation_environment",
    )
}


def ticket_history(path: Path, relative: str) -> list[str]:
    """The lines of ``path`` that cite a ticket ("issue 12", "seed 002"), as ``line: text``."""
    text = path.read_text(encoding="utf-8")
    stored = [m.span() for m in STORED_COMMENT.finditer(text)] if relative in COMMENTS_STORED_BEFORE_THE_RULE else []
    found = []
    for match in TICKET.finditer(text):
        if any(start <= match.start() < end for start, end in stored):
            continue
        line = text.count("\n", 0, match.start()) + 1
        found.append(f"{line}: {text.splitlines()[line - 1].strip()}")
    return found


def test_production_code_cites_requirements_not_tickets():
    """No file of maintenance/, harness/ or migrations/ says "issue N" or "seed 00N" (stored comments of old migrations aside)."""
    cited = {
        relative: lines
        for package in PRODUCTION
        for path in sorted((ROOT / package).rglob("*.py"))
        if (lines := ticket_history(path, relative := str(path.relative_to(ROOT))))
    }
    assert cited == {}, f"ticket history in production code (cite a docs/spec.md id or say why): {cited}"


def test_ticket_history_check_flags_a_ticket_and_spares_an_old_stored_comment(tmp_path):
    """The checker flags "issue 12" and "seed 002" in code, and a stored comment only outside the listed migrations."""
    module = tmp_path / "m.py"
    module.write_text(
        '"""Durable actions (issue 12, R-1).\n\nAs seed 002 says; R-2 stays; tissue 3 is no ticket."""\n'
        'SQL = """\nCOMMENT ON TABLE core.t IS\n    \'Fences (issue 3).\';\n"""\n',
        encoding="utf-8",
    )
    old = next(iter(sorted(COMMENTS_STORED_BEFORE_THE_RULE)))
    assert [line.split(":")[0] for line in ticket_history(module, "maintenance/m.py")] == ["1", "3", "6"]
    assert [line.split(":")[0] for line in ticket_history(module, old)] == ["1", "3"]
