"""Each envelope field's predicate (harness/queue/fields.py) against the real constraints, value by value.

A value the edge accepts must be one every table holding the field accepts, and one it refuses one
they refuse — so publish never writes what the database would refuse, and a delivery never keeps
what its dead letter could not record. Each corpus is inserted into ``core.queue_messages``,
``core.dead_letters`` and (where the column is) ``core.executions``.
"""

from __future__ import annotations

import secrets
import uuid

import psycopg
import pytest
from psycopg.types.json import Jsonb

from harness.queue.fields import (
    MAX_CORRELATION_ID_BYTES,
    correlation_id_problem,
    queue_problem,
    received_correlation_id,
    received_trace_context,
    replay_of_problem,
    trace_context_problem,
)

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

TRACEPARENTS = [
    TRACEPARENT,
    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00",
    f"00-{'0' * 31}1-{'0' * 15}1-ff",
    "",
    "not-a-traceparent",
    "01" + TRACEPARENT[2:],  # another version
    "ff" + TRACEPARENT[2:],
    TRACEPARENT.upper(),
    "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
    f"00-{'0' * 32}-b7ad6b7169203331-01",  # all-zero trace id
    f"00-0af7651916cd43dd8448eb211c80319c-{'0' * 16}-01",  # all-zero parent id
    TRACEPARENT + "\n",
    " " + TRACEPARENT,
    TRACEPARENT + "-extra",
    TRACEPARENT[:-1],
    TRACEPARENT[:10] + "\x00" + TRACEPARENT[11:],
    TRACEPARENT[:10] + "\uff10" + TRACEPARENT[11:],  # a full-width digit
    TRACEPARENT[:10] + "\ud800" + TRACEPARENT[11:],  # a lone surrogate
]

TRACESTATES = [
    "k=v",
    "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7",
    " k=v ",
    "\t",  # btrim trims spaces only: a tab is not blank to the constraint
    "a" * 512,
    "é" * 512,  # characters, not bytes
    "",
    " ",
    "   ",
    "a" * 513,
    "k=\x00",
    "k=\udc80",
]

CORRELATION_IDS = [
    "corr-1",
    "",
    "é" * (MAX_CORRELATION_ID_BYTES // 2),
    "c" * MAX_CORRELATION_ID_BYTES,
    secrets.token_hex(MAX_CORRELATION_ID_BYTES // 2),  # at the limit, incompressible
    "a\x00b",
    "a\udfffb",
    secrets.token_urlsafe(4_000),  # over what one B-tree entry holds, incompressible
]

QUEUES = ["q", " q ", "\t", "points.credit", "", " ", "    ", "q\x00", "q\ud800"]

REPLAY_OFS = [1, -1, 2**63 - 1, -(2**63), 2**63, -(2**63) - 1]

QUEUE_MESSAGE = """
INSERT INTO core.queue_messages (queue, job_id, tenant_id, correlation_id, payload, replay_of, traceparent, tracestate)
VALUES (%(queue)s, gen_random_uuid(), gen_random_uuid(), %(correlation_id)s, '{}', %(replay_of)s, %(traceparent)s,
        %(tracestate)s)
"""
DEAD_LETTER = """
INSERT INTO core.dead_letters (job_id, queue, payload, attempts, last_error, correlation_id, traceparent, tracestate)
VALUES (gen_random_uuid(), %(queue)s, '{}', 1, 'E: e', %(correlation_id)s, %(traceparent)s, %(tracestate)s)
"""
EXECUTION = """
INSERT INTO core.executions (job_id, consumer, queue, tenant_id, correlation_id, payload)
VALUES (gen_random_uuid(), 'c', %(queue)s, gen_random_uuid(), %(correlation_id)s, %(payload)s)
"""


def stored(conn: psycopg.Connection, statement: str, **values) -> bool:
    """Whether the database takes the row (each try in its own transaction)."""
    row = {"queue": "q", "correlation_id": None, "replay_of": None, "traceparent": None, "tracestate": None}
    row |= values | {"payload": Jsonb({})}
    try:
        with conn.transaction():
            conn.execute(statement, row)
    except (psycopg.Error, UnicodeEncodeError):  # a constraint, a type, text PostgreSQL cannot hold, an index entry
        return False
    return True


def agreement(
    conn: psycopg.Connection, statements: list[str], corpus, problem, column: str, *, together=False, **others
):
    """(value, accepted by the predicate, accepted by each statement) for every value the two disagree on: the
    predicate against each table, or (``together``) against the tables together — a job's record needs them all."""
    disagreeing = []
    for value in corpus:
        edge = problem(value) is None
        database = [stored(conn, statement, **{column: value}, **others) for statement in statements]
        if (edge != all(database)) if together else (database != [edge] * len(statements)):
            disagreeing.append((value[:80] if isinstance(value, str) else value, edge, database))
    return disagreeing


def test_the_traceparent_predicate_is_the_constraints(conn):
    """0017's traceparent CHECK on both tables, and the edge's predicate, take exactly the same values."""
    both = [QUEUE_MESSAGE, DEAD_LETTER]
    assert agreement(conn, both, TRACEPARENTS, lambda v: trace_context_problem(v, None), "traceparent") == []


def test_the_tracestate_predicate_is_the_constraints(conn):
    """0017's tracestate CHECKs (beside a valid traceparent) and the edge's predicate agree on every value."""
    both = [QUEUE_MESSAGE, DEAD_LETTER]
    problem = lambda v: trace_context_problem(TRACEPARENT, v)  # noqa: E731
    assert agreement(conn, both, TRACESTATES, problem, "tracestate", traceparent=TRACEPARENT) == []


def test_a_tracestate_without_a_traceparent_is_refused_by_both(conn):
    assert trace_context_problem(None, "k=v") is not None
    assert not stored(conn, QUEUE_MESSAGE, tracestate="k=v") and not stored(conn, DEAD_LETTER, tracestate="k=v")


def test_the_queue_predicate_is_the_constraints(conn):
    """``btrim(queue) <> ''`` on the three tables, text PostgreSQL can hold: the same values as the edge's."""
    tables = [QUEUE_MESSAGE, DEAD_LETTER, EXECUTION]
    assert agreement(conn, tables, QUEUES, queue_problem, "queue") == []


def test_the_correlation_id_predicate_is_what_the_tables_store_and_index(conn):
    """Text PostgreSQL holds, and short enough for dead_letters_correlation_idx whatever its bytes: the three tables
    take every value the edge takes; the NUL and the surrogate none of them takes, the over-long incompressible one
    the dead letters' index refuses (a job's message and execution could hold it, its failure could not)."""
    tables = [QUEUE_MESSAGE, DEAD_LETTER, EXECUTION]
    assert agreement(conn, tables, CORRELATION_IDS, correlation_id_problem, "correlation_id", together=True) == []
    assert not stored(conn, DEAD_LETTER, correlation_id=CORRELATION_IDS[-1])


def test_a_correlation_id_over_the_bound_is_refused_at_the_edge_though_compressible(conn):
    """The bound is stricter than the index (which compresses): a long repetitive id, stored there, is refused here —
    an id is not a document, and an incompressible one of that length would not be indexed."""
    long = "c" * (MAX_CORRELATION_ID_BYTES + 1)
    assert correlation_id_problem(long) is not None
    assert stored(conn, DEAD_LETTER, correlation_id=long)


def test_the_replay_of_predicate_is_the_bigint_column(conn):
    assert agreement(conn, [QUEUE_MESSAGE], REPLAY_OFS, replay_of_problem, "replay_of") == []


@pytest.mark.pure
@pytest.mark.parametrize(
    ("sent", "kept"),
    [
        ((TRACEPARENT, "k=v"), (TRACEPARENT, "k=v")),
        ((TRACEPARENT, "  "), (TRACEPARENT, None)),  # an invalid tracestate alone goes alone
        ((TRACEPARENT, "a" * 513), (TRACEPARENT, None)),
        (("01" + TRACEPARENT[2:], "k=v"), (None, None)),  # an invalid traceparent takes the tracestate with it
        ((TRACEPARENT.upper(), None), (None, None)),
        ((None, "k=v"), (None, None)),
        ((None, None), (None, None)),
    ],
)
def test_a_received_trace_context_keeps_what_w3c_keeps(sent, kept):
    assert received_trace_context(*sent) == kept


@pytest.mark.pure
def test_a_received_correlation_id_is_kept_or_dropped_never_altered():
    assert received_correlation_id("corr-1") == "corr-1"
    assert received_correlation_id("a\x00b") is None
    assert received_correlation_id("c" * (MAX_CORRELATION_ID_BYTES + 1)) is None
    assert received_correlation_id(None) is None


@pytest.mark.pure
def test_a_problem_names_why_never_the_value():
    secret = "00-" + "S" * 32 + "-" + "e" * 16 + "-01"
    assert "S" not in (trace_context_problem(secret, None) or "S")
    assert str(uuid.UUID(int=1)) not in (correlation_id_problem("x\x00" + str(uuid.UUID(int=1))) or "")
