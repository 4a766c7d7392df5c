"""What the phases of one durable delivery share: its :class:`Execution` and the statement that records its checkpoints.

Each phase (harness/durable/take.py, run.py, settle.py, finish.py) is a set of functions of an
:class:`Execution`: the connection, the consumer, the delivery and its validated payload, the
run-wide values (:class:`harness.fence.Runtime`), and what the take found and the run earned —
the execution's id and fencing token, its checkpoints, the results so far, and the successes not
yet committed (written with the next commit, whatever it is).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import Any, Literal

import psycopg
from psycopg.types.json import Jsonb

from harness.consumer.actions import Action
from harness.consumer.consumer import Consumer
from harness.durable import sql
from harness.fence import Runtime
from harness.pipelined import Statement
from harness.queue.port import DeadLettered, Delivery

__all__ = ["WORKER", "Checkpoint", "Execution", "Record", "StaleWrite", "check_held", "one", "row"]

# Who holds a lease: core.executions.leased_by.
WORKER = f"{socket.gethostname()}:{os.getpid()}"


class StaleWrite(Exception):
    """A fenced write matched nothing: roll back, change nothing (the delivery ends ``Stale``)."""


@dataclass
class Checkpoint:
    """An action's checkpoint as the take found it."""

    status: str
    attempts: int
    result: Any = None


@dataclass
class Record:
    """A checkpoint write waiting for the next commit (or part of it)."""

    action: Action
    position: int
    status: str
    attempts: int
    result: Any = None
    error: str | None = None


@dataclass
class Execution:
    """One delivery of a durable consumer, from its take to its outcome."""

    conn: psycopg.Connection
    consumer: Consumer[Any]
    delivery: Delivery
    payload: Any
    runtime: Runtime
    execution_id: int = 0
    token: int = 0
    checkpoints: dict[str, Checkpoint] = field(default_factory=dict)
    results: dict[str, Any] = field(default_factory=dict)
    pending: list[Record] = field(default_factory=list)  # successes not yet committed
    takes: int = 0
    final_retries: int = 0  # failed attempts of the final write, from the history

    def with_pending(self, record: Record | None) -> list[Record]:
        """The successes not yet committed, then ``record``: what the next commit writes (and so no longer pending)."""
        records, self.pending = [*self.pending, *([record] if record is not None else [])], []
        return records

    def renew_and_record(self, records: list[Record]) -> None:
        """First statement of a fenced transaction (or one alone, in autocommit): renew the lease and
        write ``records``, or raise :class:`StaleWrite` (having written nothing)."""
        check_held(self.conn.execute(*self.renewal(records)))

    def renewal(self, records: list[Record]) -> Statement:
        """The statement that renews the lease and writes ``records`` (its row: held, written)."""
        return (
            sql.RENEW_LEASE_AND_RECORD,
            {
                "id": self.execution_id,
                "token": self.token,
                "lease": self.runtime.lease,
                "actions": [r.action.name for r in records],
                "positions": [r.position for r in records],
                "effects": [str(r.action.effect) for r in records],
                "statuses": [r.status for r in records],
                "attempts": [r.attempts for r in records],
                "results": [Jsonb(r.result) if r.status == "SUCCEEDED" else None for r in records],
                "errors": [r.error for r in records],
            },
        )

    def dead_letter(self, why: Literal["permanent", "exhausted"], reason: str, *, attempts: int) -> DeadLettered:
        """The dead letter of a FAILED execution, carrying the delivery's ``replay_of``."""
        self.runtime.metrics.dead_lettered(self.consumer.name, why)
        return DeadLettered(
            reason=why,
            letter=self.delivery.letter(
                self.consumer.name,
                attempts=max(1, attempts),
                last_error=f"execution {self.execution_id} FAILED: {reason}",
            ),
        )

    def fields(self, action: Action | None, attempt: int | None) -> dict[str, Any]:
        """The fields of every ``harness.execution.*`` event."""
        return {
            "consumer": self.consumer.name,
            "job_id": str(self.delivery.envelope.job_id),
            "execution_id": self.execution_id,
            "action": action.name if action is not None else None,
            "attempt": attempt,
            "correlation_id": self.delivery.envelope.correlation_id,
        }


def one(conn: psycopg.Connection, statement: str, params: dict[str, Any]) -> tuple[Any, ...]:
    """The one row a statement always returns."""
    return row(conn.execute(statement, params))


def row(cursor: psycopg.Cursor[Any]) -> tuple[Any, ...]:
    """The one row a statement always returns, from its cursor."""
    found: tuple[Any, ...] | None = cursor.fetchone()
    assert found is not None, "the statement returns one row"
    return found


def check_held(renewed: psycopg.Cursor[Any]) -> None:
    """RENEW_LEASE_AND_RECORD's verdict: raise :class:`StaleWrite` unless this worker still held the lease."""
    held, _written = row(renewed)
    if held != 1:
        raise StaleWrite()
