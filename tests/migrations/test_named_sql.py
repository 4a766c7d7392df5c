"""Every named SQL statement of the code is valid against the migrated schema, as it stands.

A named statement is a module-level UPPER_CASE string constant, defined in a module of
maintenance/ or harness/, whose text starts with an SQL keyword. Each is EXPLAINed
(planned, not run) on a database at the newest revision, with every parameter as NULL, so a
renamed column, a missing index-backed function or a broken fragment fails here, not in
production. Nothing is assembled at run time: what is EXPLAINed is what is sent.
"""

from __future__ import annotations

import ast
import importlib
import re

import psycopg
import pytest
from support import ROOT

PACKAGES = ("maintenance", "alerts", "harness")
STARTS_AS_SQL = re.compile(r"^\s*(SELECT|INSERT|UPDATE|DELETE|WITH)\b", re.I)
PARAMETER = re.compile(r"%\((\w+)\)s|%s")


def named_statements() -> list[tuple[str, str]]:
    """(module.NAME, text) of every named statement defined (not merely imported) in our packages."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            tree = ast.parse(path.read_text())
            names = [
                t.id
                for node in tree.body
                if isinstance(node, ast.Assign)
                for t in node.targets
                if isinstance(t, ast.Name) and t.id.isupper()
            ]
            if not names:
                continue
            loaded = importlib.import_module(module)
            for name in names:
                value = getattr(loaded, name, None)
                if isinstance(value, str) and STARTS_AS_SQL.match(value):
                    found.append((f"{module}.{name}", value))
    return found


STATEMENTS = named_statements()


def as_planned(text: str) -> str:
    """The statement with every psycopg placeholder replaced by NULL (and %% by %)."""
    return PARAMETER.sub("NULL", text).replace("%%", "%")


@pytest.mark.pure
def test_finds_the_statements_of_every_package():
    """The collector sees named SQL of each package, the purge's batch statements among them."""
    names = {name for name, _ in STATEMENTS}
    assert {
        "maintenance.jobs.purge.sql.INDEX_BATCH_HASHED",
        "alerts.sql.SCAN_NEW",
        "harness.queue.pgqueue.CLAIM",
    } <= names
    assert not any("{" in text and "}" in text and re.search(r"\{\w+\}", text) for _, text in STATEMENTS), (
        "a named statement still has a .format placeholder: write it out whole"
    )


def test_every_named_statement_plans_against_the_migrated_schema(conn: psycopg.Connection):
    """EXPLAIN of each statement, parameters as NULL, succeeds on the newest schema (plus, for the conformance
    kit's statements, the tables the kit creates in a test database); failures are named."""
    from harness.testing.conformance import CREATE_KIT_TABLES

    broken = []
    for name, text in STATEMENTS:
        try:
            with conn.transaction(force_rollback=True):
                if name.startswith("harness.testing."):
                    conn.execute(CREATE_KIT_TABLES)
                conn.execute("EXPLAIN " + as_planned(text))
        except psycopg.Error as exc:
            broken.append(f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0]}")
    assert broken == [], "named statements that do not plan:\n  " + "\n  ".join(broken)


def test_a_statement_naming_a_missing_column_is_reported(conn: psycopg.Connection):
    """The check is not vacuous: a statement reading a column the schema lacks fails to plan."""
    with pytest.raises(psycopg.errors.UndefinedColumn), conn.transaction(force_rollback=True):
        conn.execute("EXPLAIN " + as_planned("SELECT no_such_column FROM core.processed_jobs WHERE job_id = %(id)s"))
