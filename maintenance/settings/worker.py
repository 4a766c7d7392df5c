"""Worker settings: the queue, lease, batch size, polling, threads and role of ``core-jobs worker``; the bulk cap.

``CORE_JOBS_WORKER_DATABASE_ROLE`` and ``CORE_JOBS_RELAY_DATABASE_ROLE`` name the least-privilege roles
the worker's and the relay's connections switch to (``SET ROLE``, migration 0020), as the API does
to its own: the login in ``CORE_JOBS_DATABASE_URL`` must be a member.

``CORE_JOBS_QUEUE_URL`` chooses the queue adapter of ``core-jobs worker`` and ``core-jobs enqueue``
(harness/queue/adapters.py): unset, the reference queue in the database of ``CORE_JOBS_DATABASE_URL``;
``amqp://``/``amqps://``, RabbitMQ; another scheme, a third party's adapter installed under it. A
scheme no adapter serves is refused at load, naming the known ones. Its password is a secret like
the database URL's: redacted by ``check-config``, masked in the logs, never in an error.

``CORE_JOBS_DEAD_LETTERS_BULK_MAX`` bounds the dead letters one bulk action by filter may touch
(``core-jobs dead-letters replay --queue Q --all-pending`` and the API's ``filter`` bodies,
:mod:`maintenance.operations.dead_letters`): a filter matching more is refused with the count, nothing changed.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any

from pydantic import BaseModel, Field, SecretStr, field_validator
from pydantic_settings import NoDecode

from harness.queue.adapters import adapter_reference, url_scheme
from maintenance.fields import CONSUMER_REFERENCE, listed
from maintenance.fields.durations import PositiveDuration

DEFAULT_WORKER_LEASE = timedelta(seconds=30)  # claim held before another worker may take it
DEFAULT_WORKER_BATCH_SIZE = 10  # messages per claim
DEFAULT_WORKER_POLL_INTERVAL = timedelta(seconds=1)  # idle wait
DEFAULT_WORKER_CONCURRENCY = 1  # threads per process
DEFAULT_WORKER_LISTEN = True  # idle: wake on the reference queue's NOTIFY, polling as the fallback
DEFAULT_WORKER_RECONNECT_FOR = timedelta(minutes=2)  # reconnecting after a lost connection, before exit 1
DEFAULT_DEAD_LETTERS_BULK_MAX = 1000  # dead letters per bulk action by filter
DEFAULT_WORKER_DATABASE_ROLE = "core_jobs_worker"  # migration 0020
DEFAULT_RELAY_DATABASE_ROLE = "core_jobs_relay"  # migration 0020


class WorkerFields(BaseModel):
    """`core-jobs worker`: the queue, the fencing lease, batch size, polling, threads; the cap of a bulk action by filter."""

    queue_url: SecretStr | None = Field(
        default=None,
        description="The queue of `core-jobs worker` and `core-jobs enqueue`, as a URL whose scheme picks the adapter: "
        "unset (or postgresql://, its host not read) the reference queue in the CORE_JOBS_DATABASE_URL database; "
        "amqp:// or amqps:// RabbitMQ (the harness's rabbitmq extra); another scheme, the adapter a package "
        "registers under it in the entry-point group core_jobs_harness.queues. Its password is redacted wherever "
        "settings are shown.",
    )

    worker_consumers: Annotated[list[str], NoDecode] = Field(
        default=[],
        description="The consumers `core-jobs worker` runs when no --consumer is given, as module:attribute "
        "(comma-separated or a JSON list), e.g. billing.credit:consumer,billing.refund:consumer: one process, "
        "each consumer on its own queue with its own lease, threads and metrics; `check-config` checks each one's "
        "TTL guard. Empty: --consumer is required.",
    )
    worker_lease: PositiveDuration = Field(
        default=DEFAULT_WORKER_LEASE,
        description="How long `core-jobs worker` holds a claimed message before another worker may take it "
        "(the fencing lease). Must cover a whole batch of handler runs.",
    )
    worker_batch_size: int = Field(
        default=DEFAULT_WORKER_BATCH_SIZE,
        ge=1,
        le=1000,
        description="Messages a worker claims at once (FOR UPDATE SKIP LOCKED); successes are acked per batch.",
    )
    worker_poll_interval: PositiveDuration = Field(
        default=DEFAULT_WORKER_POLL_INTERVAL,
        description="How long an idle worker waits before looking for ready messages again.",
    )
    worker_listen: bool = Field(
        default=DEFAULT_WORKER_LISTEN,
        description="On the reference queue: an idle `core-jobs worker` wakes as soon as a message of its queue is "
        "published, retried with no delay or released (LISTEN core_jobs_queue_ready, one more connection per "
        "process), polling every CORE_JOBS_WORKER_POLL_INTERVAL as the fallback. Off: it only polls. Ignored on a "
        "broker, which pushes.",
    )
    worker_concurrency: int = Field(
        default=DEFAULT_WORKER_CONCURRENCY,
        ge=1,
        le=64,
        description="Worker threads per `core-jobs worker` process, each with its own connection.",
    )
    worker_reconnect_for: PositiveDuration = Field(
        default=DEFAULT_WORKER_RECONNECT_FOR,
        description="How long each `core-jobs worker` thread, and `core-jobs relay`, keeps reconnecting after its "
        "database connection is lost (a failover, a restart, a terminated backend) before it gives up and exits 1. "
        "A failover takes seconds to a minute; the worker gives its batch back (the relay acks what the broker "
        "confirmed) and carries on once it reconnects.",
    )
    worker_await_standby: PositiveDuration | None = Field(
        default=None,
        description="Off when unset. Else how long `core-jobs worker` waits, after a commit, for a streaming standby "
        "to flush it before anything outside PostgreSQL acts on it: the broker's ack of a job or a dead letter, a "
        "NON_IDEMPOTENT_WRITE's request after its STARTED checkpoint (harness/replication.py). With asynchronous "
        "replication a failover otherwise loses a job RabbitMQ already acked, or sends such a write twice. Past it "
        "the batch is released (the fence decides its copy). Needs pg_monitor for the worker's role.",
    )
    worker_accept_asynchronous_replication: bool = Field(
        default=False,
        description="Off: `core-jobs worker` refuses to start (exit 2) when the database replicates to asynchronous "
        "standbys only and its consumer needs commits a failover keeps — a broker queue (an acked job whose commit "
        "the promoted standby lacks is lost) or a NON_IDEMPOTENT_WRITE (its lost STARTED checkpoint sends it "
        "twice) — with no CORE_JOBS_WORKER_AWAIT_STANDBY barrier (harness/durability.py, docs/high-availability.md). "
        "On: it starts anyway, the loss accepted, and logs the tier as a warning.",
    )
    worker_database_role: str | None = Field(
        default=DEFAULT_WORKER_DATABASE_ROLE,
        description="Role every `core-jobs worker` connection switches to (SET ROLE): the least-privilege role "
        "created by the migrations; the login must be a member of it, and the consumer's own tables granted to it "
        "(docs/harness.md). Empty: no SET ROLE (not recommended).",
    )
    relay_database_role: str | None = Field(
        default=DEFAULT_RELAY_DATABASE_ROLE,
        description="Role the `core-jobs relay` connection switches to (SET ROLE): the least-privilege role "
        "created by the migrations; the login must be a member of it. Empty: no SET ROLE (not recommended).",
    )
    dead_letters_bulk_max: int = Field(
        default=DEFAULT_DEAD_LETTERS_BULK_MAX,
        ge=1,
        le=1_000_000,
        description="The most dead letters one bulk replay or discard by filter may touch (the CLI's --all-pending, "
        "the API's filter body); a filter matching more is refused with the count, nothing changed.",
    )

    @field_validator("queue_url", mode="before")
    @classmethod
    def _check_queue_url(cls, value: Any) -> Any:
        if value is None:
            return None
        raw = (value.get_secret_value() if isinstance(value, SecretStr) else str(value)).strip()
        if not raw:
            return None
        adapter_reference(raw)  # a scheme no adapter serves: its message names the known ones, never the URL
        if url_scheme(raw) == "memory":
            raise ValueError(
                "memory:// is a queue in one process's memory, for a consumer's own tests (docs/harness.md, Testing a"
                " consumer): what a command published there would be lost when it exits; use postgresql:// or amqp://"
            )
        return SecretStr(raw)

    @field_validator("worker_consumers", mode="before")
    @classmethod
    def _consumer_list(cls, value: object) -> object:
        return listed(value)

    @field_validator("worker_consumers")
    @classmethod
    def _consumer_references(cls, value: list[str]) -> list[str]:
        malformed = [v for v in value if not CONSUMER_REFERENCE.match(v)]
        if malformed:
            raise ValueError(f"each entry is module:attribute, e.g. harness.examples.points:consumer; got {malformed}")
        twice = sorted({v for v in value if value.count(v) > 1})
        if twice:
            raise ValueError(f"{', '.join(twice)} given more than once")
        return value

    @field_validator("worker_database_role", "relay_database_role")
    @classmethod
    def _blank_is_none(cls, value: str | None) -> str | None:
        return None if value is None or not value.strip() else value.strip()

    def queue_url_value(self) -> str | None:
        """The queue URL, password included, for the worker and enqueue; None: the reference queue."""
        return None if self.queue_url is None else self.queue_url.get_secret_value()

    def queue_adapter(self) -> str:
        """``module:Class`` of the adapter the queue URL selects (not imported), for check-config."""
        return adapter_reference(self.queue_url_value())
