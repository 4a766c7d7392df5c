"""A producer's publish in its own transaction: the message commits with the producer's work, or not at all.

River's ``InsertTx`` for this harness. An application that changes its own rows and must publish a job
about them (an order is paid: credit its points) cannot do both atomically on a broker — the broker is
not in the database's transaction: publish first and a rollback leaves a job about nothing; commit first
and a crash loses the job. :func:`publish_in_transaction` writes the message into the **outbox**
(``core.queue_messages``, the same table and the same constraints as a replay's, harness/queue/relay.py)
on the producer's own connection, inside its open transaction:

- the producer **commits**: its rows and the message are in the database together. On the reference
  queue that row *is* the message (a worker claims it); on a broker (``CORE_JOBS_QUEUE_URL``) the
  relay — every worker of the queue between its batches, or ``core-jobs relay --queue Q`` — publishes
  it, with the same job id, tenant, correlation id, payload and trace context, then deletes it;
- the producer **rolls back** (or dies before its commit): no message, nothing is ever published;
- the relay dies between the broker's confirm and its delete: the row's lease runs out and it is
  published again — same job id, so the consumer's fence (``core.processed_jobs``) absorbs the second
  delivery (``Duplicate``): one effect.

It never commits, never opens a savepoint, and refuses a connection with no transaction to join (an
autocommit connection outside ``with conn.transaction():``), where it could not be atomic with anything.
docs/outbox.md ("Producers").
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from datetime import timedelta
from typing import Any
from uuid import UUID

import psycopg
from psycopg.pq import TransactionStatus

from harness.queue.ids import new_job_id
from harness.queue.pgqueue import PgQueue
from harness.queue.port import NO_TENANT, Envelope

__all__ = ["NoTransaction", "publish_in_transaction"]


class NoTransaction(Exception):
    """:func:`publish_in_transaction` on a connection with no open transaction to join (or a failed one)."""


class _CallersTransaction(PgQueue):
    """The reference adapter writing in its caller's transaction: never one of its own, never a commit."""

    def _one_statement(self) -> AbstractContextManager[object]:
        return nullcontext()


def publish_in_transaction(
    conn: psycopg.Connection[Any],
    queue_name: str,
    payload: Any,
    *,
    job_id: UUID | None = None,
    tenant_id: UUID = NO_TENANT,
    correlation_id: str | None = None,
    delay: timedelta = timedelta(0),
) -> UUID:
    """Write a job for ``queue_name`` into the outbox in ``conn``'s transaction; its job id.

    Published (by the relay, on a broker) only once the caller commits; never if it rolls back.
    ``job_id``: the job's identity, which every delivery of it carries and the consumer's fence
    keys on — give your own (derived from what the job is about) to make a producer's retry of
    the same transaction one job; a new time-ordered one (:func:`~harness.queue.ids.new_job_id`) otherwise. ``delay``: deliverable that much after the
    commit's transaction began (on PostgreSQL's clock). A payload jsonb cannot store raises
    :class:`~harness.queue.port.InvalidPayload`, another field the table refuses
    :class:`~harness.queue.port.InvalidEnvelope`, before any write; :class:`NoTransaction` when
    ``conn`` has no transaction to join: an autocommit connection outside ``with conn.transaction():``,
    or a transaction already failed. A connection not in autocommit mode begins its transaction here
    if it had none yet, and the caller's ``conn.commit()`` commits it.
    """
    status = conn.info.transaction_status
    if status == TransactionStatus.INERROR:
        raise NoTransaction("the connection's transaction has failed: roll it back before publishing")
    if status == TransactionStatus.IDLE and conn.autocommit:
        raise NoTransaction(
            "publish_in_transaction joins the caller's transaction, and this autocommit connection has none open: "
            "call it inside `with conn.transaction():` with the work it must commit with"
        )
    if status not in (TransactionStatus.IDLE, TransactionStatus.INTRANS):
        raise NoTransaction(f"the connection is busy ({status.name}): publish from an idle or open transaction")
    envelope = Envelope(
        job_id=new_job_id() if job_id is None else job_id,
        payload=payload,
        tenant_id=tenant_id,
        correlation_id=correlation_id,
    )
    _CallersTransaction(conn).publish(queue_name, envelope, delay=delay)
    return envelope.job_id
