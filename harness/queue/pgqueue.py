"""The reference queue adapter: messages in ``core.queue_messages``, on PostgreSQL's clock.

For the demo, the tests and small deployments — and, for a queue that lives on a broker, the
**outbox** the operations layer publishes to in its own transaction (replays, RESUMEs), as does a producer
(``publish_in_transaction``, harness/queue/outbox.py), and a relay
moves to the broker (harness/queue/relay.py, docs/outbox.md). Every decision about time uses the server's
``now()``: no worker sleeps to wait for a retry and nothing is queued in memory (R-1).

- **Claim**: up to ``limit`` ready messages (``run_at <= now()``, no live lease) in ``run_at``
  order, ``FOR UPDATE SKIP LOCKED`` so concurrent workers never wait for each other. A claim
  counts one attempt and takes a lease until ``now() + lease`` with a new **fencing token**
  from a sequence.
- **Ack** deletes the message — an acked message leaves no row (J-AC8). **Retry** records the
  failed attempt (``last_error``, ``last_failed_at``) and ``run_at = now() + delay`` in one
  statement. **Dead letter** deletes the message and inserts the dead letter in one
  transaction. All three match on the token *and* an unexpired lease: a worker whose lease
  expired changes nothing (its call returns False).
- **Lease expiry**: a message whose lease expired is ready again; the redelivery counts an
  attempt, says ``redelivered`` (its worker may have died of it: the worker runs it alone, and a
  claim takes at most one such), and the fence absorbs it if the first worker did commit its work.
- **Release** gives claimed but unhandled messages back at once (a worker stopping), without
  counting the attempt.
- **Publish** checks every payload first (harness/queue/port.py, ``check_payload``), except one read
  back as stored that Python cannot decode (an ``UndecodablePayload``: a RESUME of such an execution),
  which is written back exactly as it was stored; the worker makes it its poison dead letter.
- **Publish many** sends the batch as one COPY (a bulk replay, a producer's batch), every payload
  checked and written to JSON text in one pass first; all or none, and the table's triggers (the
  API role's publish guard) see the batch as they see an INSERT's rows. A pipeline (a RESUME's
  writes) cannot carry a COPY: there the same rows go as one INSERT of arrays.
- **An unmigrated database** (no ``core.queue_messages``): a claim or a publish raises
  :class:`~harness.pg.SchemaNotMigrated`, saying to run ``core-jobs migrate``, not ``UndefinedTable``.
- **Replays**: ``replay_of`` (the dead letter a replay republished) is a column of the message,
  so it survives retries and lease expiries; the claim hands it back in the envelope, and the
  harness marks that replay handled with the delivery's final outcome (harness/queue/port.py).

Each method runs in its own transaction on the adapter's connection (autocommit mode); called
inside an open transaction of that connection it joins it (a savepoint), which is how a replay
publishes and marks its dead letter atomically. A publish writes with one statement, atomic by itself:
inside an open transaction it joins it without a savepoint, so in a pipeline (a RESUME's writes) it adds
no round trip.

Claims, acks and releases commit with ``synchronous_commit = off``: they are cheap to lose. A
server crash can forget only the last few of them (any later synchronous commit — a work
transaction — flushes them too), and a forgotten claim or ack only means a redelivery, which
the fence absorbs. It saves two disk flushes per batch. Publishing, retries and dead letters
stay synchronous — whatever the database's default, since every connection pins
``synchronous_commit`` (harness/pg.py): losing those would lose a job or a failure record. The
asynchronous ones say so for their own transaction only (:data:`ASYNC_COMMIT`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg
from psycopg.abc import Dumper
from psycopg.adapt import PyFormat
from psycopg.pq import PipelineStatus, TransactionStatus
from psycopg.types.json import Jsonb

from harness.dead_letters import DeadLetter, write_dead_letter
from harness.pg import SchemaNotMigrated
from harness.pipelined import Statement
from harness.queue.port import (
    Delivery,
    Envelope,
    UndecodablePayload,
    check_envelope,
    check_fields,
    check_payload,
    decode_payload,
    payload_json,
)
from harness.queue.publishing import keeps_its_context, publish_context, publish_span

__all__ = ["PgQueue"]

PUBLISH = """
INSERT INTO core.queue_messages (queue, job_id, tenant_id, correlation_id, payload, replay_of, traceparent, tracestate,
                                 run_at)
VALUES (%(queue)s, %(job_id)s, %(tenant_id)s, %(correlation_id)s, %(payload)s, %(replay_of)s, %(traceparent)s,
        %(tracestate)s, now() + %(delay)s)
RETURNING id
"""

# Many messages in one statement: COPY, one line of text per message (a bulk replay's 10 000, a producer's
# batch), run_at and the other columns left to their defaults. COPY fires the table's triggers as an
# INSERT does: the API role's publish guard (migrations 0014, 0017) sees the whole batch in its
# transition table.
PUBLISH_MANY = """
COPY core.queue_messages (queue, job_id, tenant_id, correlation_id, payload, replay_of, traceparent, tracestate)
FROM STDIN
"""

# The same with a delay: COPY takes no expressions, so run_at is given — PUBLISH_MANY_RUN_AT's value.
PUBLISH_MANY_DELAYED = """
COPY core.queue_messages (queue, job_id, tenant_id, correlation_id, payload, replay_of, traceparent, tracestate, run_at)
FROM STDIN
"""

# When a delayed batch is due, on the database's clock: the transaction's now() + delay, as text in
# this session's DateStyle and TimeZone, which COPY reads back in the same session to the same instant.
PUBLISH_MANY_RUN_AT = "SELECT (now() + %(delay)s)::text"

# Inside a pipeline, which cannot carry a COPY (a RESUME's re-queue, pipelined with its other writes):
# the rows as parallel arrays, one element per message, in one INSERT.
PUBLISH_MANY_PIPELINED = """
INSERT INTO core.queue_messages (queue, job_id, tenant_id, correlation_id, payload, replay_of, traceparent, tracestate,
                                 run_at)
SELECT m.queue, m.job_id, m.tenant_id, m.correlation_id, m.payload, m.replay_of, m.traceparent, m.tracestate,
       now() + %(delay)s
  FROM unnest(%(queues)s::text[], %(job_ids)s::uuid[], %(tenant_ids)s::uuid[], %(correlation_ids)s::text[],
              %(payloads)s::jsonb[], %(replay_ofs)s::bigint[], %(traceparents)s::text[], %(tracestates)s::text[])
       AS m(queue, job_id, tenant_id, correlation_id, payload, replay_of, traceparent, tracestate)
"""

# Ready = due and not under a live lease. SKIP LOCKED: a row another claimer holds is skipped.
# A ready row whose lease expired (lease_expires_at set: settling and releasing clear it) is a
# redelivery — its last claimer died or gave up without settling it, perhaps killed by it — and a
# claim takes at most one of those, the first in order, beside the fresh ones: the worker runs it
# alone after the rest (harness/worker.py), so a job that kills its worker takes only itself.
# The payload comes back as text and is decoded per delivery, after the claim committed: one the
# worker cannot decode is that delivery's poison, never an error that rolls the claim back.
# The claim, the ack and the release commit asynchronously (_ASYNC_COMMIT: from inside the statement).
CLAIM = """
WITH candidates AS (
    SELECT id, lease_expires_at IS NOT NULL AS redelivered, run_at
      FROM core.queue_messages
     WHERE queue = %(queue)s
       AND run_at <= now()
       AND (lease_expires_at IS NULL OR lease_expires_at <= now())
       AND (SELECT set_config('synchronous_commit', 'off', true)) = 'off'
     ORDER BY run_at, id
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), ready AS (
    SELECT id, redelivered
      FROM (SELECT id, redelivered,
                   count(*) FILTER (WHERE redelivered) OVER (ORDER BY run_at, id) AS nth_redelivered
              FROM candidates) AS c
     WHERE NOT redelivered OR nth_redelivered = 1
)
UPDATE core.queue_messages AS m
   SET attempts = m.attempts + 1,
       lease_token = nextval('core.queue_lease_token_seq'),
       lease_expires_at = now() + %(lease)s,
       leased_by = %(worker)s
  FROM ready
 WHERE m.id = ready.id
RETURNING m.id, m.lease_token, m.job_id, m.tenant_id, m.correlation_id, m.payload::text, m.replay_of, m.attempts,
          m.run_at, m.traceparent, m.tracestate, ready.redelivered
"""

# Transaction-local: this transaction's commit does not wait for its WAL to reach the disk.
ASYNC_COMMIT = "SELECT set_config('synchronous_commit', 'off', true)"
# The same from inside a statement: an uncorrelated subquery, run once (an InitPlan) before the first row that
# passes the conditions before it is locked or written, so every row the statement writes was written after it.
# On an idle connection the statement is then its own transaction, committing asynchronously, in one round trip:
# no BEGIN, SET and COMMIT around it (those cost a claim or an ack ~70 us of the worker's CPU, docs/performance.md).
_ASYNC_COMMIT = "(SELECT set_config('synchronous_commit', 'off', true)) = 'off'"

# Inside a caller's transaction: its setting before the statement, and put back after it (PgQueue._cheap).
CURRENT_COMMIT = "SELECT current_setting('synchronous_commit')"
RESTORE_COMMIT = "SELECT set_config('synchronous_commit', %(setting)s, true)"

# The fencing condition shared by every settling write: this lease, still alive.
_HELD = "m.id = h.id AND m.lease_token = h.token AND m.lease_expires_at > now()"

ACK = f"""
DELETE FROM core.queue_messages AS m
 USING unnest(%(ids)s::bigint[], %(tokens)s::bigint[]) AS h(id, token)
 WHERE {_HELD}
   AND {_ASYNC_COMMIT}
"""

RETRY = f"""
UPDATE core.queue_messages AS m
   SET run_at = now() + %(delay)s,
       last_error = %(error)s,
       last_failed_at = now(),
       lease_token = NULL, lease_expires_at = NULL, leased_by = NULL
  FROM (VALUES (%(id)s::bigint, %(token)s::bigint)) AS h(id, token)
 WHERE {_HELD}
"""

REMOVE_FOR_DEAD_LETTER = f"""
DELETE FROM core.queue_messages AS m
 USING (VALUES (%(id)s::bigint, %(token)s::bigint)) AS h(id, token)
 WHERE {_HELD}
RETURNING m.id
"""

# Ready now, the attempt not counted. A redelivered delivery stays one: its lease is made expired, not cleared
# (CLAIM tells a redelivery by a lease that is set and over; no settle can use it any more), so given back by a
# stopping worker it still runs alone. Like any expired lease it is found by polling, not announced (0024).
RELEASE = f"""
UPDATE core.queue_messages AS m
   SET attempts = m.attempts - 1,
       lease_token = CASE WHEN h.redelivered THEN m.lease_token END,
       lease_expires_at = CASE WHEN h.redelivered THEN now() END,
       leased_by = CASE WHEN h.redelivered THEN m.leased_by END
  FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[], %(redelivered)s::boolean[]) AS h(id, token, redelivered)
 WHERE {_HELD}
   AND {_ASYNC_COMMIT}
"""


# The worker's gauges of a queue (harness/metrics.py): ready messages — CLAIM's condition — and how
# long the oldest has been due. Read between batches at most every figures_interval, never per
# delivery; the (queue, run_at, id) index bounds it to the queue's due rows.
QUEUE_FIGURES = """
SELECT count(*), coalesce(extract(epoch FROM now() - min(run_at)), 0)::float8
  FROM core.queue_messages
 WHERE queue = %(queue)s
   AND run_at <= now()
   AND (lease_expires_at IS NULL OR lease_expires_at <= now())
"""

# Due messages under a live lease, and when the last of those leases ends (on the database's clock):
# what a relay's `--once` reports instead of an empty outbox while another claimer — perhaps dead — holds them.
LEASED_FIGURES = """
SELECT count(*), max(lease_expires_at)
  FROM core.queue_messages
 WHERE queue = %(queue)s
   AND run_at <= now()
   AND lease_expires_at > now()
"""


class PgQueue:
    """The reference :class:`~harness.queue.port.QueuePort` on ``core.queue_messages``."""

    system = "postgresql"  # the messaging.system of its spans

    def __init__(self, conn: psycopg.Connection, *, lease: timedelta = timedelta(seconds=30), worker: str = "") -> None:
        if lease <= timedelta(0):
            raise ValueError(f"lease must be positive, got {lease}")
        self.conn = conn
        self.lease = lease
        self.worker = worker

    @classmethod
    def from_url(
        cls, url: str | None, conn: psycopg.Connection, *, worker: str = "", lease: timedelta = timedelta(seconds=30)
    ) -> PgQueue:
        """The reference queue for a ``postgresql://`` URL (harness/queue/adapters.py): it lives in ``conn``'s
        database, so the URL says only which adapter; its host and database are not read."""
        return cls(conn, lease=lease, worker=worker)

    def close(self) -> None:
        """Nothing to let go: the connection is the caller's, and stays open."""

    def publish(self, queue: str, envelope: Envelope, *, delay: timedelta = timedelta(0)) -> int:
        """Enqueue ``envelope`` on ``queue``, deliverable after ``delay``; return the message id.

        A payload jsonb cannot store raises :class:`~harness.queue.port.InvalidPayload`, another field the table
        refuses :class:`~harness.queue.port.InvalidEnvelope` naming it, before any write.
        """
        check_envelope(queue, envelope)
        try:
            with publish_span([(queue, envelope)], system=self.system) as traced, self._one_statement():
                row = self.conn.execute(PUBLISH, self._publish_params(queue, traced[0][1], delay)).fetchone()
        except psycopg.errors.UndefinedTable as exc:  # an unmigrated database: say what to run
            raise SchemaNotMigrated.from_error(exc) from None
        assert row is not None
        value: int = row[0]
        return value

    def publish_many(
        self,
        messages: Sequence[tuple[str, Envelope]],
        *,
        delay: timedelta = timedelta(0),
        keep_context: bool = False,
    ) -> None:
        """Enqueue every ``(queue, envelope)`` with one statement (:data:`PUBLISH_MANY`, a COPY).

        All or none: one payload jsonb cannot store raises :class:`~harness.queue.port.InvalidPayload`
        before any write (each is checked and written to JSON text in one pass, ``payload_json``), and a
        message the database refuses fails the statement. What a bulk replay uses (10 000 messages: one
        COPY, not 10 000 INSERTs). Inside a pipeline: :data:`PUBLISH_MANY_PIPELINED`, no round trip.
        ``keep_context``: every envelope's trace context is written as given — none stays none — and no
        publish span is recorded (a RESUME's re-queue continues its job, it starts no trace of its own).
        """
        if self.conn.info.pipeline_status != PipelineStatus.OFF:
            self._publish_pipelined(messages, delay, keep_context)
            return
        for queue, envelope in messages:
            check_fields(queue, envelope)
        dumper = self._json_dumper()
        payloads = [_copy_payload(envelope.payload, dumper) for _queue, envelope in messages]
        if not messages:
            return
        with (
            publish_context(messages, system=self.system, keep_context=keep_context) as (traceparent, tracestate),
            self._one_statement(),
        ):
            run_at = ""
            if delay:
                row = self.conn.execute(PUBLISH_MANY_RUN_AT, {"delay": delay}).fetchone()
                assert row is not None
                run_at = f"\t{row[0]}"
            lines = []
            for (queue, envelope), payload in zip(messages, payloads, strict=True):
                if traceparent is None or keeps_its_context(envelope):
                    parent, state = envelope.traceparent, envelope.tracestate
                else:
                    parent, state = traceparent, tracestate
                lines.append(
                    f"{_copy_text(queue)}\t{_copy_text(envelope.job_id)}\t{_copy_text(envelope.tenant_id)}\t"
                    f"{_copy_text(envelope.correlation_id)}\t{payload}\t{_copy_text(envelope.replay_of)}\t"
                    f"{_copy_text(parent)}\t{_copy_text(state)}{run_at}\n"
                )
            with self.conn.cursor() as cursor, cursor.copy(PUBLISH_MANY_DELAYED if delay else PUBLISH_MANY) as copy:
                copy.write("".join(lines))

    def _publish_pipelined(
        self, messages: Sequence[tuple[str, Envelope]], delay: timedelta, keep_context: bool
    ) -> None:
        for queue, envelope in messages:
            check_envelope(queue, envelope)
        if not messages:
            return
        with publish_span(messages, system=self.system, keep_context=keep_context) as traced, self._one_statement():
            messages = traced
            self.conn.execute(
                PUBLISH_MANY_PIPELINED,
                {
                    "queues": [q for q, _e in messages],
                    "job_ids": [e.job_id for _q, e in messages],
                    "tenant_ids": [e.tenant_id for _q, e in messages],
                    "correlation_ids": [e.correlation_id for _q, e in messages],
                    "payloads": [_stored(e.payload) for _q, e in messages],
                    "replay_ofs": [e.replay_of for _q, e in messages],
                    "traceparents": [e.traceparent for _q, e in messages],
                    "tracestates": [e.tracestate for _q, e in messages],
                    "delay": delay,
                },
            )

    def _one_statement(self) -> AbstractContextManager[object]:
        """A transaction for one statement, or none inside the caller's (a savepoint would cost round trips)."""
        idle = self.conn.info.transaction_status == TransactionStatus.IDLE
        return self.conn.transaction() if idle else nullcontext()

    def _json_dumper(self) -> Dumper | None:
        """The connection's jsonb dumper when it is not json.dumps (``set_json_dumps``): what publish's Jsonb sends,
        which publish_many's COPY must write too; None for the default, which ``payload_json`` writes faster."""
        dumper = self.conn.adapters.get_dumper(Jsonb, PyFormat.TEXT)(Jsonb, self.conn)
        return None if getattr(dumper, "dumps", None) is json.dumps else dumper

    @staticmethod
    def _publish_params(queue: str, envelope: Envelope, delay: timedelta) -> dict[str, Any]:
        return {
            "queue": queue,
            "job_id": envelope.job_id,
            "tenant_id": envelope.tenant_id,
            "correlation_id": envelope.correlation_id,
            "payload": _stored(envelope.payload),
            "replay_of": envelope.replay_of,
            "traceparent": envelope.traceparent,
            "tracestate": envelope.tracestate,
            "delay": delay,
        }

    def claim(self, queue: str, limit: int) -> list[Delivery]:
        """Lease up to ``limit`` ready messages of ``queue``, oldest ``run_at`` first."""
        params = {"queue": queue, "limit": limit, "lease": self.lease, "worker": self.worker}
        try:
            rows = self._cheap((CLAIM, params)).fetchall()
        except psycopg.errors.UndefinedTable as exc:  # an unmigrated database: say what to run
            raise SchemaNotMigrated.from_error(exc) from None
        rows.sort(key=lambda r: (r[8], r[0]))
        return [
            Delivery(
                queue=queue,
                envelope=Envelope(
                    job_id=job_id,
                    payload=decode_payload(payload),
                    tenant_id=tenant_id,
                    correlation_id=correlation_id,
                    replay_of=replay_of,
                    traceparent=traceparent,
                    tracestate=tracestate,
                ),
                attempt=attempts,
                receipt=(message_id, token),
                redelivered=redelivered,
            )
            for (
                message_id,
                token,
                job_id,
                tenant_id,
                correlation_id,
                payload,
                replay_of,
                attempts,
                _run_at,
                traceparent,
                tracestate,
                redelivered,
            ) in rows
        ]

    def figures(self, queue: str) -> tuple[int, float]:
        """(ready messages, seconds the oldest of them has been due — 0 when none is) of ``queue``."""
        depth, age = self.conn.execute(QUEUE_FIGURES, {"queue": queue}).fetchone()  # type: ignore[misc]
        return int(depth), float(age)

    def leased(self, queue: str) -> tuple[int, datetime | None]:
        """(due messages of ``queue`` under a live lease, when the last of those leases ends — None when none is)."""
        count, until = self.conn.execute(LEASED_FIGURES, {"queue": queue}).fetchone()  # type: ignore[misc]
        return int(count), until

    def ack(self, deliveries: Sequence[Delivery]) -> int:
        """Delete the messages still leased by these deliveries; return how many were."""
        return self._by_receipts(ACK, deliveries)

    def release(self, deliveries: Sequence[Delivery]) -> int:
        """Give unhandled deliveries back, ready now, their attempt not counted; a redelivered one stays so."""
        return self._by_receipts(RELEASE, deliveries, redelivered=[d.redelivered for d in deliveries])

    def retry(self, delivery: Delivery, delay: timedelta, error: str) -> bool:
        """Record the failed attempt and schedule the next at ``now() + delay``, in one statement."""
        message_id, token = delivery.receipt
        with self.conn.transaction():
            cursor = self.conn.execute(RETRY, {"id": message_id, "token": token, "delay": delay, "error": error})
            return cursor.rowcount == 1

    def dead_letter(self, delivery: Delivery, letter: DeadLetter) -> bool:
        """Remove the message and write its dead letter, in one transaction; False if the lease was lost."""
        message_id, token = delivery.receipt
        with self.conn.transaction():
            if self.conn.execute(REMOVE_FOR_DEAD_LETTER, {"id": message_id, "token": token}).fetchone() is None:
                return False
            # Not written when the job's failure is already a pending letter of this consumer (one per
            # failure, harness/dead_letters.py): the message goes all the same, its failure is recorded.
            write_dead_letter(self.conn, letter)
            return True

    def _by_receipts(self, statement: str, deliveries: Sequence[Delivery], **params: Any) -> int:
        if not deliveries:
            return 0
        ids = [d.receipt[0] for d in deliveries]
        tokens = [d.receipt[1] for d in deliveries]
        return self._cheap((statement, {"ids": ids, "tokens": tokens, **params})).rowcount

    def _cheap(self, statement: Statement) -> psycopg.Cursor[Any]:
        """``statement`` (CLAIM, ACK, RELEASE: each sets its transaction's commit asynchronous, :data:`_ASYNC_COMMIT`)
        as a transaction of its own on an idle connection in autocommit — one round trip (a claim or ack the server
        commits after its worker died is one lost to a crash just after: a redelivery, which the fence absorbs).

        Inside the caller's transaction, a savepoint of it, and the transaction's setting put back after it: the
        caller's own writes commit as the caller's transaction does, never asynchronously because of this one.
        """
        if self.conn.info.transaction_status == TransactionStatus.IDLE and self.conn.autocommit:
            return self.conn.execute(*statement)
        with self.conn.transaction():
            (setting,) = self.conn.execute(CURRENT_COMMIT).fetchone()  # type: ignore[misc]
            cursor = self.conn.execute(*statement)
            self.conn.execute(RESTORE_COMMIT, {"setting": setting})
            return cursor


def _stored(payload: Any) -> Jsonb:
    """The jsonb to write: an :class:`UndecodablePayload`'s text exactly as PostgreSQL printed it (a RESUME of
    such an execution re-queues it unchanged; the worker makes it its poison dead letter), else the value."""
    return Jsonb(payload.text, dumps=str) if isinstance(payload, UndecodablePayload) else Jsonb(payload)


# COPY's text format: a tab between columns, a newline after each row, \N for NULL, and a backslash
# escapes. A payload's JSON text (json.dumps: ASCII, its control characters escaped) needs only its
# backslashes doubled; any other text, its four special characters escaped.
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _copy_text(value: object) -> str:
    """``value`` as a column of a COPY text row: NULL, a UUID's or an integer's text, or text escaped."""
    if value is None:
        return "\\N"
    if type(value) is UUID or type(value) is int:  # exactly: a subclass's text could be anything
        return str(value)
    return str(value).translate(_COPY_ESCAPES)


def _copy_payload(payload: Any, dumper: Dumper | None) -> str:
    """The payload column of a COPY row, checked (``payload_json``) — written by the connection's own json dumps
    when one is set (``dumper``), as publish's Jsonb is; an :class:`UndecodablePayload` is written back exactly as
    PostgreSQL printed it (a RESUME of such an execution; the worker makes it its poison)."""
    if isinstance(payload, UndecodablePayload):
        return _copy_text(payload.text)
    if dumper is None:
        return payload_json(payload).replace("\\", "\\\\")
    check_payload(payload)
    return _copy_text(bytes(dumper.dump(Jsonb(payload)) or b"").decode())
