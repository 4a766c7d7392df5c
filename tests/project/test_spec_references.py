"""docs/spec.md is the project's specification: every identifier the repository cites has an entry there.

Pure: reads files, no database, no network.

An *identifier* is what :data:`IDENTIFIER` matches — one or two capitals, a hyphen, optional
capitals, digits: ``J-B3``, ``J-AC6``, ``R-2``, ``NF-7``, ``J-API1``. It is *cited* wherever it
occurs in the scanned files (:data:`SCANNED`). It has an *entry* in docs/spec.md when a line
starts its item, in one of two forms (see :func:`spec_entries`):

- a Markdown heading whose text begins with it: ``### J-B3 — Retry policy``;
- a list item whose text begins with it in bold: ``- **TS-001** — the schema task``.

A mention anywhere else (``see J-B3``, a bold word mid-line) is a citation, not an entry.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import pytest
from support import ROOT

pytestmark = pytest.mark.pure

SPEC = ROOT / "docs" / "spec.md"
THIS_FILE = Path(__file__).resolve()

# Where identifiers are cited: the code, its tests, the chart, the benchmarks and the docs.
SCANNED = ("maintenance", "alerts", "harness", "migrations", "tests", "bench", "helm", "docs", "README.md")

# What counts as a citation (the pattern the specification's identifiers follow).
IDENTIFIER = re.compile(r"\b[A-Z]{1,2}-[A-Z]*[0-9]+\b")

# An entry's identifier may be any upstream tag too (T12, TS-001, DEC-C5), hence the wider pattern.
_ENTRY_ID = r"(?P<id>[A-Z]+(?:-[A-Z]*)?[0-9]+)"
HEADING_ENTRY = re.compile(rf"^#{{2,6}}[ \t]+{_ENTRY_ID}(?![\w-])")
BOLD_ITEM_ENTRY = re.compile(rf"^[ \t]*[-*][ \t]+\*\*{_ENTRY_ID}\*\*")

# Strings the scan finds that are not specification identifiers: (file, string) -> what it is.
# Keyed by file, so the same string cited as an identifier anywhere else is still checked.
NOT_IDENTIFIERS = {
    ("helm/core-jobs/values.schema.json", "A-Z0"): "the character class [A-Z0-9_] of the CORE_JOBS_* name pattern",
    ("tests/alerts/test_settings.py", "P-1"): "a Better Stack escalation policy id, a test value",
    ("tests/alerts/test_heartbeat.py", "P-7"): "a Better Stack escalation policy id, a test value",
    ("tests/chart/test_settings_contract.py", "P-123"): "a Better Stack escalation policy id, a test value",
}

# The identifiers of the English digest of seeds 000 and 002: each needs an entry even if nothing cites it.
SEED_IDENTIFIERS = (
    [f"J-B{n}" for n in range(1, 10)] + [f"J-AC{n}" for n in range(1, 9)] + [f"R-{n}" for n in range(1, 8)]
)

# A repository path in backticks, optionally ``::name`` of a function, class or constant in it.
_REPO_REFERENCE = re.compile(
    r"`(?P<path>(?:maintenance|alerts|harness|migrations|tests|bench|helm|docs)/[\w./-]+\.\w+)(?:::(?P<name>\w+))?`"
)


def scanned_files() -> list[Path]:
    """Every text file under SCANNED except docs/spec.md (the target) and this module (it spells NOT_IDENTIFIERS)."""
    files: list[Path] = []
    for name in SCANNED:
        top = ROOT / name
        candidates = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        for path in candidates:
            if "__pycache__" in path.parts or path.resolve() in (SPEC.resolve(), THIS_FILE):
                continue
            files.append(path)
    return files


def cited_identifiers() -> dict[str, list[str]]:
    """identifier -> the ``path:line`` places citing it, NOT_IDENTIFIERS left out."""
    cited: dict[str, list[str]] = defaultdict(list)
    for path in scanned_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:  # a binary file cites nothing
            continue
        relative = path.relative_to(ROOT).as_posix()
        for number, line in enumerate(text.splitlines(), start=1):
            for match in IDENTIFIER.finditer(line):
                if (relative, match.group()) not in NOT_IDENTIFIERS:
                    cited[match.group()].append(f"{relative}:{number}")
    return cited


def spec_entries(text: str) -> list[tuple[str, int]]:
    """(identifier, line number) of every entry in ``text``, in order."""
    entries = []
    for number, line in enumerate(text.splitlines(), start=1):
        match = HEADING_ENTRY.match(line) or BOLD_ITEM_ENTRY.match(line)
        if match:
            entries.append((match.group("id"), number))
    return entries


def spec_text() -> str:
    assert SPEC.is_file(), f"{SPEC.relative_to(ROOT)} is missing: it is the specification the code cites"
    return SPEC.read_text(encoding="utf-8")


def test_an_entry_is_a_heading_or_a_bold_list_item_starting_with_the_identifier():
    """Headings and bold list items that begin with an identifier are entries; mentions elsewhere are not."""
    text = "\n".join(
        [
            "### J-B3 — Retry policy",
            "## NF-12 Throughput",
            "- **TS-001** — the schema task",
            "  * **DEC-C5** the evidence guarantee",
            "### J-B30",
            "See J-B4 for the alert.",
            "**J-B5** in bold at the start of a paragraph",
            "- the retry policy (**J-B6**)",
            "#### 1. J-B7 numbered",
            "### J-B8x is not an identifier",
        ]
    )
    assert spec_entries(text) == [("J-B3", 1), ("NF-12", 2), ("TS-001", 3), ("DEC-C5", 4), ("J-B30", 5)]


def test_every_identifier_cited_in_the_repository_has_a_spec_entry():
    """Every identifier cited in the code, tests, chart, benchmarks, README and docs has an entry in docs/spec.md."""
    entries = {identifier for identifier, _ in spec_entries(spec_text())}
    missing = {identifier: places for identifier, places in cited_identifiers().items() if identifier not in entries}
    assert not missing, "cited but without an entry in docs/spec.md:\n" + "\n".join(
        f"  {identifier}: {', '.join(places[:5])}{' …' if len(places) > 5 else ''}"
        for identifier, places in sorted(missing.items())
    )


def test_spec_has_no_duplicate_entries():
    """No identifier starts two items of docs/spec.md, so each citation resolves to exactly one place."""
    lines: dict[str, list[int]] = defaultdict(list)
    for identifier, number in spec_entries(spec_text()):
        lines[identifier].append(number)
    duplicates = {identifier: numbers for identifier, numbers in lines.items() if len(numbers) > 1}
    assert not duplicates, f"entries defined more than once (identifier: lines): {duplicates}"


def test_spec_has_an_entry_for_every_seed_identifier():
    """J-B1..J-B9, J-AC1..J-AC8 and R-1..R-7 each have an entry, whether or not the code cites them yet."""
    entries = {identifier for identifier, _ in spec_entries(spec_text())}
    assert [identifier for identifier in SEED_IDENTIFIERS if identifier not in entries] == []


def test_every_excluded_string_still_occurs_in_its_file():
    """Each NOT_IDENTIFIERS string still occurs in the file it is excluded for, so the list cannot go stale."""
    stale = [
        f"{path}: {string}"
        for path, string in NOT_IDENTIFIERS
        if not (ROOT / path).is_file() or string not in IDENTIFIER.findall((ROOT / path).read_text(encoding="utf-8"))
    ]
    assert stale == [], f"excluded but no longer found there: {stale}"


def test_spec_names_only_files_and_definitions_that_exist():
    """Every `path` and `path::name` docs/spec.md gives as where a requirement is built or tested exists."""
    broken = []
    for match in _REPO_REFERENCE.finditer(spec_text()):
        path, name = ROOT / match.group("path"), match.group("name")
        if not path.is_file():
            broken.append(f"{match.group('path')}: no such file")
        elif name and not re.search(
            rf"^\s*(?:def|class)\s+{name}\b|^{name}\s*=", path.read_text(encoding="utf-8"), re.M
        ):
            broken.append(f"{match.group('path')}::{name}: not defined there")
    assert broken == [], "docs/spec.md points at what does not exist:\n  " + "\n  ".join(broken)
