"""Every comment on an object of schema core says what the object is, never which issue or seed asked for it."""

from __future__ import annotations

import re

import psycopg

from maintenance.runtime import migrate

# Every comment on schema core and on what lives in it: relations and their columns, functions,
# constraints, types, triggers.
CORE_COMMENTS = """
SELECT pg_describe_object(d.classoid, d.objoid, d.objsubid), d.description
  FROM pg_description AS d
 WHERE (d.classoid = 'pg_namespace'::regclass AND d.objoid = 'core'::regnamespace)
    OR (d.classoid = 'pg_class'::regclass
        AND d.objoid IN (SELECT oid FROM pg_class WHERE relnamespace = 'core'::regnamespace))
    OR (d.classoid = 'pg_proc'::regclass
        AND d.objoid IN (SELECT oid FROM pg_proc WHERE pronamespace = 'core'::regnamespace))
    OR (d.classoid = 'pg_constraint'::regclass
        AND d.objoid IN (SELECT oid FROM pg_constraint WHERE connamespace = 'core'::regnamespace))
    OR (d.classoid = 'pg_type'::regclass
        AND d.objoid IN (SELECT oid FROM pg_type WHERE typnamespace = 'core'::regnamespace))
    OR (d.classoid = 'pg_trigger'::regclass
        AND d.objoid IN (SELECT t.oid FROM pg_trigger AS t JOIN pg_class AS c ON c.oid = t.tgrelid
                          WHERE c.relnamespace = 'core'::regnamespace))
 ORDER BY 1
"""

# An issue ("issue 17", "#17"), a seed document ("seed 000"), or a seed's requirement id (J-B1, J-AC7, R-3, NF-9).
TICKET = re.compile(r"\bissues?\b|\bseeds?\b|#\d|\b(?:J|R|NF)-[A-Z]*\d", re.IGNORECASE)


def ticket_references(url: str) -> list[tuple[str, str]]:
    with psycopg.connect(url) as conn:
        return [(what, text) for what, text in conn.execute(CORE_COMMENTS) if TICKET.search(text)]


def test_no_comment_in_schema_core_names_an_issue_or_a_seed(database_url):
    """pg_description of every object of core: none names an issue, a seed or a seed's requirement id."""
    assert ticket_references(database_url) == []


def test_the_pattern_finds_what_the_old_comments_said(empty_database_url):
    """Before 0021 the catalog held eleven such comments: the pattern sees each of them."""
    migrate.upgrade(empty_database_url, "0020_worker_relay_roles")
    assert len(ticket_references(empty_database_url)) == 11
    migrate.upgrade(empty_database_url)
    assert ticket_references(empty_database_url) == []
    migrate.downgrade(empty_database_url, "0020_worker_relay_roles")
    assert len(ticket_references(empty_database_url)) == 11
