"""One source of the enumerations (harness/enumerations.py), equal to the database's CHECK constraints, and every
value the database allows served by every response model of the API (issue 17, item 4)."""

from __future__ import annotations

import re
from collections import defaultdict

import pytest
from support.factories import add_dead_letter, add_execution, resolve_execution

from harness import enumerations
from harness.consumer.actions import Effect
from maintenance.api.resources.resolutions import ResolutionOut
from maintenance.operations import dead_letters as operations

# Tables whose rows the API serves: every enumerated column of theirs must be in enumerations.BY_COLUMN.
SERVED_TABLES = frozenset(table for table, _ in enumerations.BY_COLUMN)

CHECKS = """
SELECT c.conrelid::regclass::text, pg_get_constraintdef(c.oid)
  FROM pg_constraint AS c JOIN pg_namespace AS n ON n.oid = c.connamespace
 WHERE n.nspname = 'core' AND c.contype = 'c'"""

# What pg_get_constraintdef prints for `col IN ('a', 'b')` and for `col = 'a'`.
IN_LIST = re.compile(r"\(?(\w+) = ANY \(\(?ARRAY\[([^\]]*)\]")
EQUALS = re.compile(r"\(?(\w+) = '([^']*)'::text")
LITERAL = re.compile(r"'([^']*)'::text")


def allowed_by_the_database(conn) -> dict[tuple[str, str], set[str]]:
    """(table, column) → every text literal the CHECK constraints of schema core compare that column with."""
    allowed: dict[tuple[str, str], set[str]] = defaultdict(set)
    for table, definition in conn.execute(CHECKS):
        table = table.removeprefix("core.")
        for column, literals in IN_LIST.findall(definition):
            allowed[(table, column)].update(LITERAL.findall(literals))
        for column, literal in EQUALS.findall(definition):
            allowed[(table, column)].add(literal)
    return allowed


def test_every_enumeration_equals_the_database_check_constraint(conn):
    """Each enumerated column of a served table allows exactly the values harness.enumerations lists, no more, no less."""
    allowed = allowed_by_the_database(conn)
    served = {key: values for key, values in allowed.items() if key[0] in SERVED_TABLES}
    assert {key: set(values) for key, values in enumerations.BY_COLUMN.items()} == served


def test_the_effect_enum_has_the_values_the_database_allows():
    """harness.consumer.actions.Effect, which consumers declare, has exactly the values of enumerations.EFFECTS."""
    assert tuple(Effect) == enumerations.EFFECTS


def test_every_response_model_uses_the_one_source():
    """The API's response models declare their enumerated fields with the types of harness.enumerations."""
    from maintenance.api.resources import dead_letters as routes
    from maintenance.api.resources import executions

    declared = {
        (executions.ExecutionOut, "status"): enumerations.ExecutionStatus,
        (executions.CheckpointOut, "effect"): enumerations.EffectName,
        (executions.CheckpointOut, "status"): enumerations.CheckpointStatus,
        (executions.ExecutionEventOut, "kind"): enumerations.EventKind,
        (routes.DeadLetterOut, "status"): enumerations.DeadLetterStatus,
        (routes.ActionOut, "action"): enumerations.DeadLetterAction,
        (ResolutionOut, "command"): enumerations.ResolutionCommand,
        (ResolutionOut, "evidence_kind"): enumerations.EvidenceKind,
        (ResolutionOut, "status"): enumerations.ResolvedStatus,
    }
    for (model, field), source in declared.items():
        assert model.model_fields[field].annotation == source, f"{model.__name__}.{field}"


@pytest.fixture
def every_execution_value(conn) -> list[int]:
    """Executions holding every status, checkpoint effect × status and event kind the database allows; their ids."""
    checkpoints = tuple(
        (f"{effect.lower()}-{status.lower()}", effect, status, {"ok": True} if status == "SUCCEEDED" else None)
        for effect in enumerations.EFFECTS
        for status in enumerations.CHECKPOINT_STATUSES
    )
    events = tuple((kind, "notify") for kind in enumerations.EVENT_KINDS)
    ids = [
        add_execution(conn, status=status, checkpoints=checkpoints, events=events)
        for status in enumerations.EXECUTION_STATUSES
    ]
    for status, evidence in (
        ("PENDING", "RESULT_VERIFIED"),
        ("FAILED", "ABSENT_VERIFIED"),
        ("FAILED", "COMPENSATED_VERIFIED"),
    ):
        resolved = add_execution(conn)
        resolve_execution(conn, resolved, status, evidence=evidence)  # writes an EXECUTION_RESOLVED event
        ids.append(resolved)
    return ids


def test_every_execution_value_the_database_allows_is_served(api, conn, every_execution_value):
    """The list of every status and the detail of executions holding every effect, checkpoint status and event kind answer 200."""
    for status in enumerations.EXECUTION_STATUSES:
        listed = api.get("/v1/core/executions", params={"status": status})
        assert listed.status_code == 200, listed.text
        assert {item["status"] for item in listed.json()["items"]} == {status}
    kinds: set[str] = set()
    for execution_id in every_execution_value:
        detail = api.get(f"/v1/core/executions/{execution_id}")
        assert detail.status_code == 200, detail.text
        kinds |= {event["kind"] for event in detail.json()["events"]}
    assert kinds == set(enumerations.EVENT_KINDS)


def test_every_stored_resolution_response_fits_the_resolution_model(conn, every_execution_value):
    """Each resolution the ledger holds (every command and evidence kind) validates as ResolutionOut."""
    bodies = [body for (body,) in conn.execute("SELECT response_body FROM core.execution_resolutions")]
    assert {b["evidence_kind"] for b in bodies} == set(enumerations.EVIDENCE_KINDS)
    for body in bodies:
        ResolutionOut.model_validate(body)


def test_every_dead_letter_value_the_database_allows_is_served(api, conn):
    """Dead letters in every status, replay outcome and audit action are listed and detailed with 200."""
    ids = [add_dead_letter(conn, status=status) for status in enumerations.DEAD_LETTER_STATUSES]
    for outcome in set(enumerations.REPLAY_OUTCOMES) - {"released"}:  # a release needs its reason: below
        ids.append(add_dead_letter(conn, status="replayed", handled=outcome))
    replayed, discarded, released = (add_dead_letter(conn) for _ in range(3))
    operations.replay(conn, [replayed, released], operator="ops")
    conn.execute("DELETE FROM core.queue_messages")  # the replayed messages are purged: never delivered
    operations.discard(conn, [discarded], operator="ops", reason="duplicate, ticket OPS-1")
    operations.release(conn, [released], operator="ops", reason="the message was purged, ticket OPS-2")
    ids += [replayed, discarded, released]
    for status in enumerations.DEAD_LETTER_STATUSES:
        listed = api.get("/v1/core/dead-letters", params={"status": status})
        assert listed.status_code == 200, listed.text
    actions: set[str] = set()
    for letter_id in ids:
        detail = api.get(f"/v1/core/dead-letters/{letter_id}")
        assert detail.status_code == 200, detail.text
        actions |= {a["action"] for a in detail.json()["actions"]}
    assert actions == set(enumerations.DEAD_LETTER_ACTIONS)
