"""The worker loop: runs one consumer on its queue — the reference PostgreSQL queue, or a broker's.

:class:`WorkerGroup` runs several consumers in one process, one :class:`Worker` each, stopped together.

Why a loop of its own: each thread claims a batch, has each delivery handled under its fence
(harness/handling.py, with the one :class:`~harness.fence.Runtime` the worker makes), settles the
outcomes through the port (harness/queue/port.py) and acks the batch's successes — so that no bad
message, lost connection or stop loses a job or runs it twice, and one bad message never stops the
others. Its manual — threads and connections, shared transactions, the outbox relay, stopping,
failures and reconnection, the durability tier, exit codes and events — is docs/harness.md,
"The worker loop".
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, closing, contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import psycopg
import structlog
from psycopg.pq import TransactionStatus

from harness import replication, tracing, waiting
from harness.consumer.consumer import Consumer
from harness.consumer.retry import RetryPolicy, compute_delay
from harness.durability import DurabilityTier, DurabilityTierTooLow, needs_of, read_tier
from harness.errors import describe_error, describe_traceback
from harness.fence import Runtime
from harness.handling import BatchProgress, handle, handle_together
from harness.metrics import NO_METRICS, WorkerMetrics
from harness.pg import connect, prepare, require_schema
from harness.queue.adapters import adapter_class
from harness.queue.pgqueue import PgQueue
from harness.queue.port import (
    Acked,
    DeadLettered,
    Delivery,
    Duplicate,
    Held,
    Outcome,
    QueuePort,
    RetryAfter,
    Stale,
    settle,
)
from harness.queue.relay import Relay
from harness.queue.wakeup import Wakeup
from harness.reconnect import DatabaseUnavailable, Outage, is_lost
from harness.replication import ReplicationBarrier
from harness.ttl_guard import DEFAULT_TTL_MARGIN, TtlGuard, worker_window

__all__ = ["DatabaseUnavailable", "Worker", "WorkerConfig", "WorkerGroup", "WorkerGroupError", "WorkerStats"]

log = structlog.get_logger()

# Giving a batch back after the worker's connection was lost opens a fresh one; in a real outage
# the server does not answer either, and the worker must not hang on its way out. Every connection
# the worker opens waits at most this long.
GIVE_BACK_CONNECT_TIMEOUT_S = 5


@dataclass(frozen=True)
class WorkerConfig:
    fence_ttl: timedelta
    lease: timedelta = timedelta(seconds=30)
    batch_size: int = 10
    poll_interval: timedelta = timedelta(seconds=1)
    concurrency: int = 1
    # How often the worker reads its queue's depth and oldest ready age for its metrics.
    figures_interval: timedelta = timedelta(seconds=15)
    # On a broker: how often the worker relays its queue's outbox rows (replays, RESUMEs) to it.
    relay_interval: timedelta = timedelta(seconds=1)
    # How long a thread keeps reconnecting after its database connection was lost before the worker gives up.
    reconnect_for: timedelta = timedelta(minutes=2)
    # The TTL guard's factor: fence_ttl must be at least this times the longest a job may still be delivered.
    ttl_margin: float = DEFAULT_TTL_MARGIN
    # Off (None), or how long to wait after a commit for a standby to flush it before the broker's ack (or a
    # non-idempotent write's request) acts on it (harness/replication.py); past it the batch is released instead.
    await_standby: timedelta | None = None
    # Start over asynchronous standbys even where the consumer needs commits a failover keeps (a broker queue, a
    # NON_IDEMPOTENT_WRITE) and no barrier guards them: the operator accepts the loss (harness/durability.py).
    accept_asynchronous_replication: bool = False
    # On the reference queue: an idle thread wakes on the queue's NOTIFY (harness/queue/wakeup.py), polling as the
    # fallback; False: it only polls.
    listen: bool = True

    def __post_init__(self) -> None:
        if self.await_standby is not None and self.await_standby <= timedelta(0):
            raise ValueError(f"await_standby must be positive, got {self.await_standby}")
        for name in ("fence_ttl", "lease", "poll_interval", "figures_interval", "relay_interval", "reconnect_for"):
            if getattr(self, name) <= timedelta(0):
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("batch_size", "concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")


@dataclass
class WorkerStats:
    processed: int = 0
    duplicates: int = 0
    retried: int = 0
    dead_lettered: int = 0
    leases_lost: int = 0
    released: int = 0
    held: int = 0  # durable executions parked RECONCILIATION_REQUIRED (acked)
    stale: int = 0  # durable executions this worker lost to another (nothing settled)
    failed: int = 0  # deliveries ended by an unexpected error of their own (harness.worker.delivery_failed)
    connections_lost: int = 0  # database connections lost and reconnected from (harness.worker.connection_lost)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + n)

    def fields(self) -> dict[str, int]:
        return {
            "num_processed": self.processed,
            "num_duplicates": self.duplicates,
            "num_retried": self.retried,
            "num_dead_lettered": self.dead_lettered,
            "num_leases_lost": self.leases_lost,
            "num_released": self.released,
            "num_held": self.held,
            "num_stale": self.stale,
            "num_failed": self.failed,
            "num_connections_lost": self.connections_lost,
        }


class Worker:
    """Runs one consumer's queue: claim a batch, handle each delivery under its fence, settle it; until stopped.

    ``Worker(conninfo, consumer, policy=RetryPolicy(), config=WorkerConfig(fence_ttl=timedelta(days=7)))``, then
    :meth:`run` — ``run(once=True)`` returns when nothing is ready (a test, a cron), else it runs until
    :meth:`stop` (safe from a signal handler: the message in hand is finished first) — and returns its
    :class:`WorkerStats`. What ``core-jobs worker --consumer module:object`` builds from the settings.

    - ``conninfo``: the database (libpq URL) whose ``core`` schema holds the fences and dead letters, migrated
      (``core-jobs migrate``; else :class:`~harness.pg.SchemaNotMigrated` at the first connection). Each of
      ``config.concurrency`` threads opens its own connection, and reconnects for ``config.reconnect_for`` after
      losing it (then :class:`DatabaseUnavailable`).
    - ``consumer``: the :class:`~harness.consumer.consumer.Consumer`; its queue is the one claimed.
    - ``policy``: the retry policy of the queue (the consumer's own ``retry_policy=`` wins);
      ``config.fence_ttl`` must outlive it (the TTL guard: a ``ValueError`` here saying the minimum).
    - ``queue_url``: the adapter (harness/queue/adapters.py): None or ``postgresql://`` the reference queue in the
      same database, ``amqp://…`` RabbitMQ (whose outbox this worker relays between batches).
    - ``metrics``: where counts go (:data:`~harness.metrics.NO_METRICS` by default; ``HarnessMetrics(registry)``);
      ``database_role``: each connection's ``SET ROLE`` (``core_jobs_worker``); ``stop``: an event that stops it
      too; ``application_name``: the sessions' name in ``pg_stat_activity``.

    Events ``harness.worker.*`` and ``harness.job.*`` (docs/reference/events.md); docs/harness.md.
    """

    def __init__(
        self,
        conninfo: str,
        consumer: Consumer[Any],
        *,
        policy: RetryPolicy,
        config: WorkerConfig,
        metrics: WorkerMetrics = NO_METRICS,
        application_name: str = "core-jobs-worker",
        stop: threading.Event | None = None,
        queue_url: str | None = None,
        database_role: str | None = None,
    ) -> None:
        self._adapter = adapter_class(queue_url)  # a URL no adapter can open is refused now, not in every thread
        self.queue_url = queue_url
        self.conninfo = conninfo
        self.database_role = database_role  # each connection's SET ROLE (core_jobs_worker): None, none
        self.consumer = consumer
        window = worker_window(consumer, policy, config.lease, self._adapter, queue_url)
        guard = TtlGuard(ttl=config.fence_ttl, window=window, margin=config.ttl_margin)
        if not guard.ok:  # a late retry or redelivery would find no fence and apply the job again
            raise ValueError(
                f"fence_ttl {config.fence_ttl} is shorter than ttl_margin {config.ttl_margin:g} x the longest a job of"
                f" {consumer.name} may still be delivered ({window}: its retry window"
                f"{' and execution window' if consumer.durable else ''} and the queue's redelivery horizon):"
                f" at least {guard.required} (harness/ttl_guard.py)"
            )
        self.config = config
        self.metrics = metrics
        # What every delivery is handled with, made once and passed down to the fence (harness/fence.py).
        self.runtime = Runtime(
            policy=consumer.policy(policy), fence_ttl=config.fence_ttl, lease=config.lease, metrics=metrics
        )
        self.application_name = application_name
        self.stats = WorkerStats()
        self._stopping = stop if stop is not None else threading.Event()  # set: finish the message in hand, stop
        self.name = f"{socket.gethostname()}:{os.getpid()}"
        self._figures_lock = threading.Lock()
        self._figures_due = 0.0  # time.monotonic() at which the queue figures are read next
        self._relay_due = 0.0  # time.monotonic() at which the outbox is relayed next (on a broker)
        self._barrier = ReplicationBarrier(config.await_standby) if config.await_standby else None
        # Only an ack outside this database acts on a commit: the reference queue acks in the same one.
        self._acks_outside = not issubclass(self._adapter, PgQueue)
        self._local = threading.local()  # per thread: ``pending``, what a lost connection could not give back yet
        self.tier: DurabilityTier | None = None  # read by run() from the primary
        self._wakeup: Wakeup | None = None  # while run() runs on the reference queue, listening: its idle wait
        metrics.watch(consumer.name, consumer.queue)

    def stop(self) -> None:
        """Finish the message in hand, then stop (safe from a signal handler)."""
        self._stopping.set()

    def run(self, *, once: bool = False) -> WorkerStats:
        """Run until stopped (or, with ``once``, until no message is ready); return the counts."""
        log.info(
            "harness.worker.start",
            consumer=self.consumer.name,
            queue=self.consumer.queue,
            concurrency=self.config.concurrency,
            batch_size=self.config.batch_size,
            once=once,
        )
        try:
            self.tier = self._durability_tier()
        except BaseException:
            log.info("harness.worker.stop", consumer=self.consumer.name, **self.stats.fields(), ok=False)
            raise
        errors: list[BaseException] = []

        def loop(index: int) -> None:
            try:
                self._loop(f"{self.name}/{index}", once)
            except BaseException as exc:  # reported by run(), after every thread ended
                errors.append(exc)
                self._stopping.set()

        threads = [threading.Thread(target=loop, args=(i,), name=f"worker-{i}") for i in range(self.config.concurrency)]
        self._wakeup = self._listen(once)
        try:
            for thread in threads:
                thread.start()
            waiting.join(threads)  # in the main thread, in slices: a SIGTERM another thread caught is handled
        finally:
            if self._wakeup is not None:
                self._wakeup.close()
                self._wakeup = None
        log.info("harness.worker.stop", consumer=self.consumer.name, **self.stats.fields(), ok=not errors)
        if errors:
            raise errors[0]
        return self.stats

    def _durability_tier(self) -> DurabilityTier:
        """The database's durability tier, read from the primary and logged; DurabilityTierTooLow if it does not give
        what the consumer needs and nothing was accepted instead (harness/durability.py)."""
        with connect(
            self.conninfo,
            autocommit=True,
            role=self.database_role,
            primary_only=True,
            application_name=f"{self.application_name}/tier",
            connect_timeout=GIVE_BACK_CONNECT_TIMEOUT_S,
        ) as conn:
            tier = read_tier(conn)
        needs = needs_of(self.consumer, broker=self._acks_outside)
        shortfall = tier.shortfall(needs, barrier=self._barrier is not None)
        accepted = shortfall is not None and self.config.accept_asynchronous_replication
        fields = {
            "consumer": self.consumer.name,
            **tier.fields(),
            "needs": needs.describe(),
            "barrier": self._barrier is not None,
            "accepted": accepted,
            "meaning": tier.meaning(),
        }
        if shortfall is None:
            log.info("harness.worker.durability_tier", **fields)
        else:  # accepted, or refused just below
            log.warning("harness.worker.durability_tier", **fields)
        if shortfall is not None and not accepted:
            raise DurabilityTierTooLow(f"{self.consumer.name}: {shortfall}")
        return tier

    def _loop(self, worker_name: str, once: bool) -> None:
        """This thread's sessions: one per database connection, a new one after a connection is lost.

        A lost connection (a failover, a restart, a terminated backend) ends the session, not the thread: what the
        batch held is given back (on a fresh connection, or on the next one if none can be had), and the thread
        reconnects with a bounded backoff, for at most ``reconnect_for`` before it gives up (DatabaseUnavailable).
        """
        outage = Outage(self.config.reconnect_for)
        while not self._stopping.is_set():
            reached = False  # the server answered: a failure after this is a connection lost, not a wrong address
            try:
                conn = psycopg.connect(
                    self.conninfo,
                    autocommit=True,
                    application_name=self.application_name,
                    connect_timeout=GIVE_BACK_CONNECT_TIMEOUT_S,
                )
                reached = True
                prepare(conn, autocommit=True, role=self.database_role, primary_only=True)
                try:
                    replication.register(conn, self._barrier)  # a role that cannot see the standbys: refused
                except BaseException:
                    conn.close()
                    raise
            except psycopg.OperationalError as exc:
                if not outage.ongoing and not reached:
                    raise  # unreachable from the start: a configuration to fix, not an outage to wait out
                if outage.begin():  # lost while being set up (a terminated backend): an outage like any other
                    self._connection_lost(worker_name, exc)
                attempt, delay = outage.failed(exc)  # DatabaseUnavailable past reconnect_for
                log.warning(
                    "harness.worker.reconnect_failed",
                    consumer=self.consumer.name,
                    worker=worker_name,
                    attempt=attempt,
                    delay_s=delay,
                    error=describe_error(exc),
                )
                self._stopping.wait(delay)
                continue
            lost = False  # read inside the block: leaving it closes the connection either way
            try:
                with conn, closing(self._open_queue(conn, worker_name)) as queue:
                    lasted = outage.end()
                    if lasted is not None:
                        log.info(
                            "harness.worker.reconnected",
                            consumer=self.consumer.name,
                            worker=worker_name,
                            after_s=lasted[0],
                            attempts=lasted[1],
                        )
                    try:
                        self._give_back_pending(conn, queue)
                        self._session(conn, queue, worker_name, once)
                    except Exception:
                        lost = is_lost(conn)
                        raise
                    return  # stopped, or drained (once)
            except Exception as exc:
                if not lost:
                    raise  # not the connection (a broker unreachable, a bug): the worker's own failure, as before
                outage.begin()
                self._connection_lost(worker_name, exc)

    def _connection_lost(self, worker_name: str, exc: BaseException) -> None:
        """Count and log a lost database connection (harness.worker.connection_lost); the thread reconnects."""
        self.stats.add("connections_lost")
        connection_lost = getattr(self.metrics, "connection_lost", None)  # optional in a WorkerMetrics
        if connection_lost is not None:
            connection_lost(self.consumer.name)
        log.warning(
            "harness.worker.connection_lost", consumer=self.consumer.name, worker=worker_name, error=describe_error(exc)
        )

    def _session(self, conn: psycopg.Connection, queue: QueuePort, worker_name: str, once: bool) -> None:
        """Claim and run batches on ``conn`` until stopped (or, with ``once``, until nothing is ready)."""
        require_schema(conn)  # an unmigrated database: SchemaNotMigrated, saying what to run
        relay = self._outbox_relay(conn, queue, worker_name)
        while not self._stopping.is_set():
            if is_lost(conn):  # lost while the last batch was given back: a new session
                raise psycopg.OperationalError("the worker's database connection was lost")
            self._read_figures(conn, queue)
            self._relay_outbox(relay)
            batch = queue.claim(self.consumer.queue, self.config.batch_size)
            if not batch:
                if once:
                    return
                self._idle_wait()
                continue
            self._run_batch(conn, queue, batch)

    def _listen(self, once: bool) -> Wakeup | None:
        """The process's one listening connection for this run (harness/queue/wakeup.py), closed when the worker is
        asked to stop; None with ``once`` (it never idles), ``listen`` off, or on a broker (which pushes)."""
        if once or not self.config.listen or self._adapter is not PgQueue:
            return None
        wakeup = Wakeup(self.conninfo, application_name=f"{self.application_name}/listen").start()

        def close_on_stop() -> None:  # run() returns only once the stop event is set: this thread ends with it
            self._stopping.wait()
            wakeup.close()

        threading.Thread(target=close_on_stop, name="worker-listen-stop", daemon=True).start()
        return wakeup

    def _idle_wait(self) -> None:
        """After an empty claim: ``poll_interval``, or less — the worker stopping, or a message of the queue announced
        ready (NOTIFY, when listening)."""
        timeout = self.config.poll_interval.total_seconds()
        if self._wakeup is None:
            self._stopping.wait(timeout)
        else:
            self._wakeup.wait(self.consumer.queue, timeout)

    def _give_back_pending(self, conn: psycopg.Connection, queue: QueuePort) -> None:
        """What a lost connection's batch could not give back then (no fresh connection either): now, on this one."""
        pending: list[tuple[list[Delivery], list[Delivery], list[Delivery]]] = getattr(self._local, "pending", [])
        self._local.pending = []
        for done, unstarted, rolled_back in pending:
            self._end_batch(conn, queue, done, unstarted, rolled_back)

    def _open_queue(self, conn: psycopg.Connection, worker_name: str) -> QueuePort:
        """This thread's port of the configured adapter, on ``conn``."""
        port: QueuePort = self._adapter.from_url(self.queue_url, conn, worker=worker_name, lease=self.config.lease)
        return port

    def _read_figures(self, conn: psycopg.Connection, queue: QueuePort) -> None:
        """The queue's depth and oldest ready age for the metrics, when due: one thread, one read per interval.

        Skipped for an adapter that cannot tell them (no ``figures``, or it returns None): the gauges are left alone.
        """
        figures = getattr(queue, "figures", None)
        if figures is None or not self._due("_figures_due", self.config.figures_interval):
            return
        try:
            read = figures(self.consumer.queue)
        except Exception as exc:
            # Only metrics: a failed read (a statement timeout on a large backlog) must not stop the
            # messages. _usable rolls back a transaction it left open, so the next claim is not refused.
            if not _usable(conn):
                raise  # the connection is lost: the worker stops, as designed
            log.warning("harness.worker.figures_failed", queue=self.consumer.queue, error=describe_error(exc))
            return  # the gauges keep their last values until the next read
        if read is not None:
            depth, age = read
            self.metrics.queue_figures(self.consumer.queue, depth, age)

    def _due(self, attribute: str, interval: timedelta) -> bool:
        """Whether the periodic chore whose next time is ``self.<attribute>`` is due; if so, its next time moves on.

        Under one lock, so that of the worker's threads one does it per interval.
        """
        with self._figures_lock:
            now = time.monotonic()
            if now < getattr(self, attribute):
                return False
            setattr(self, attribute, now + interval.total_seconds())
            return True

    def _outbox_relay(self, conn: psycopg.Connection, queue: object, worker_name: str) -> Relay | None:
        """The relay of this worker's queue from the outbox to ``queue``; None on the reference queue (a PgQueue
        on the worker's own connection), which is its own outbox."""
        if isinstance(queue, PgQueue) and queue.conn is conn:
            return None
        outbox = PgQueue(conn, lease=self.config.lease, worker=f"{worker_name}/relay")
        metrics = self.metrics if hasattr(self.metrics, "relayed") else None  # optional in a WorkerMetrics
        return Relay(outbox, queue, [self.consumer.queue], batch_size=self.config.batch_size, metrics=metrics)  # type: ignore[arg-type]

    def _relay_outbox(self, relay: Relay | None) -> None:
        """On a broker, relay the outbox when due: one thread per ``relay_interval``. A failure is the relay's
        (logged ``harness.relay.error``, its batch given back); only a lost connection stops the worker."""
        if relay is None or not self._due("_relay_due", self.config.relay_interval):
            return
        try:
            relay.run_once()
        except Exception:
            if not _usable(relay.source.conn):
                raise

    def _replicated_or_released(
        self, conn: psycopg.Connection, done: list[Delivery], unstarted: list[Delivery], since: int | None
    ) -> tuple[list[Delivery], list[Delivery]]:
        """(to ack, to release): the batch's successes are acked only once a standby has their commits; if none does
        within ``await_standby``, or a commit of the batch came back uncertain (its synchronous-replication wait
        cancelled: ``since``, harness/replication.py), they are released — a copy each, whose redelivery the fence
        decides."""
        try:
            replication.after_commit(conn, since)
        except replication.CommitUncertain as exc:
            log.warning(
                "harness.worker.commit_uncertain", consumer=self.consumer.name, num_released=len(done), error=str(exc)
            )
            return [], unstarted + done
        except replication.NotReplicated as exc:
            log.warning(
                "harness.worker.not_replicated", consumer=self.consumer.name, num_released=len(done), error=str(exc)
            )
            return [], unstarted + done
        return done, unstarted

    def _retry_rolled_back(self, queue: QueuePort, deliveries: Sequence[Delivery]) -> None:
        """Retry each delivery a failed shared transaction rolled back, its attempt counted, after the policy's backoff.

        Counted, never released: whichever job made the transaction fail would otherwise share the next one again,
        forever. Past ``max_attempts`` the redelivery is dead-lettered unrun (harness/handling.py, step 4).
        """
        for delivery in deliveries:
            fields = _fields(delivery, self.consumer.name)
            delay = compute_delay(self.runtime.policy, delivery.attempt)
            if queue.retry(delivery, delay, ROLLED_BACK):
                self.stats.add("retried")
                self.metrics.retry(self.consumer.name)
                log.info("harness.job.retry_scheduled", **fields, delay_s=delay.total_seconds(), error=ROLLED_BACK)
            else:
                self._lease_lost()
                log.warning("harness.job.lease_lost", **fields)

    def _lease_lost(self, n: int = 1) -> None:
        self.stats.add("leases_lost", n)
        self.metrics.leases_lost(self.consumer.name, n)

    def _run_batch(self, conn: psycopg.Connection, queue: QueuePort, batch: list[Delivery]) -> None:
        """The batch's fresh deliveries first, settled and acked; then each redelivered one alone, settled at once.

        A redelivered delivery's earlier one never settled: its worker may have died of it. Run last and alone,
        with nothing else of the batch at stake, a job that kills its worker takes only itself (the adapters
        hand out at most one per claim, harness/queue/port.py).
        """
        fresh = [delivery for delivery in batch if not delivery.redelivered]
        groups = [fresh] if fresh else []
        groups += [[delivery] for delivery in batch if delivery.redelivered]
        for index, group in enumerate(groups):
            later = [delivery for rest in groups[index + 1 :] for delivery in rest]
            if self._stopping.is_set():
                self._end_batch(conn, queue, [], group + later)
                return
            try:
                self._run_group(conn, queue, group)
            except BaseException:
                self._end_batch(conn, queue, [], later)
                raise

    def _run_group(self, conn: psycopg.Connection, queue: QueuePort, batch: list[Delivery]) -> None:
        if len(batch) > 1 and self.consumer.shares_transactions and not self.consumer.durable:
            self._run_together(conn, queue, batch)
            return
        done: list[Delivery] = []
        started = 0
        since = replication.uncertain_commits(conn)  # a commit of this group that comes back uncertain: no ack
        try:
            for delivery in batch:
                if self._stopping.is_set():
                    break
                started += 1
                self._run_one(conn, queue, delivery, done)
        finally:
            # Stopping or failing mid-batch: the message in hand keeps its lease and its counted
            # attempt (if it is what broke the worker, the attempt budget still ends it); the
            # unstarted rest did nothing wrong and goes back at once.
            self._end_batch(conn, queue, done, batch[started:], since=since)

    def _run_together(self, conn: psycopg.Connection, queue: QueuePort, batch: list[Delivery]) -> None:
        """The batch's work in shared transactions (harness.handling.handle_together), then each outcome settled.

        Each delivery keeps its own span (current while it is handled and while it is settled), its
        handling time and its log events. Successes are acked with the batch, after their commit;
        a failure is settled alone. A delivery whose work was rolled back with a transaction that
        never committed (the worker stopping or losing its connection) goes back like an unstarted one.
        """
        progress = BatchProgress()
        spans: dict[int, tracing.Span] = {}
        provider = tracing.provider_set()  # read once for the batch
        since = replication.uncertain_commits(conn)  # a commit of this batch that comes back uncertain: no ack

        def each(delivery: Delivery) -> AbstractContextManager[None]:
            span = spans.get(id(delivery))
            if span is None:
                span = spans[id(delivery)] = self._open_span(delivery, queue, provider)
            return self._handling(span)

        done: list[Delivery] = []
        failure: BaseException | None = None
        try:
            handle_together(
                conn, self.consumer, batch, self.runtime, progress, each=each, stopping=self._stopping.is_set
            )
        except BaseException as exc:
            failure = exc
        try:
            for delivery, outcome in progress.settled:
                span = spans.pop(id(delivery))
                with tracing.within(span):
                    self._settle_one(conn, queue, delivery, outcome, done, span)
                span.end()
            if failure is not None and isinstance(failure, Exception) and progress.in_hand is not None:
                if not _usable(conn):
                    raise failure
                in_hand = progress.in_hand
                span = spans.pop(id(in_hand))
                with tracing.within(span):
                    tracing.set_error(span, describe_error(failure))
                    self._delivery_failed(conn, queue, in_hand, failure, _fields(in_hand, self.consumer.name))
                span.end()
                failure = None
        finally:
            for span in spans.values():  # the deliveries given back, and the one in hand when the worker stops
                span.end()
            ended = {id(delivery) for delivery, _outcome in progress.settled}
            ended |= {id(delivery) for delivery in progress.rolled_back}
            kept = {id(d) for d in progress.kept}  # each keeps its lease and its attempt: back redelivered, alone
            if failure is not None and progress.in_hand is not None:  # it keeps its lease and its attempt
                kept.add(id(progress.in_hand))
            unstarted = [d for d in batch if id(d) not in ended and id(d) not in kept]
            self._end_batch(conn, queue, done, unstarted, progress.rolled_back, since=since)
        if failure is not None:
            raise failure

    def _settle_one(
        self,
        conn: psycopg.Connection,
        queue: QueuePort,
        delivery: Delivery,
        outcome: Outcome | Exception,
        done: list[Delivery],
        span: tracing.Span,
    ) -> None:
        """Settle one outcome of a shared-transaction batch, as :meth:`_run_one` would; an error of its own fails it alone."""
        fields = _fields(delivery, self.consumer.name)
        try:
            if isinstance(outcome, Exception):
                raise outcome
            self._settle(queue, delivery, outcome, done, fields, span)
        except Exception as exc:
            if not _usable(conn):
                raise
            tracing.set_error(span, describe_error(exc))
            self._delivery_failed(conn, queue, delivery, exc, fields)

    def _run_one(self, conn: psycopg.Connection, queue: QueuePort, delivery: Delivery, done: list[Delivery]) -> None:
        fields = _fields(delivery, self.consumer.name)
        span = self._open_span(delivery, queue)
        try:
            with tracing.within(span):
                try:
                    with self._timed():
                        outcome = handle(conn, self.consumer, delivery, self.runtime)
                    self._settle(queue, delivery, outcome, done, fields, span)
                except Exception as exc:
                    if not _usable(conn):
                        raise  # the worker itself is broken (its connection is lost): it stops, as designed
                    tracing.set_error(span, describe_error(exc), describe_traceback(exc))
                    self._delivery_failed(conn, queue, delivery, exc, fields)
        finally:
            span.end()

    def _open_span(self, delivery: Delivery, queue: QueuePort, provider: bool | None = None) -> tracing.Span:
        """The delivery's ``<queue> process`` span, started, not current: every attempt is a child of the message's
        context (the job's publish, or the replayed letter's)."""
        envelope = delivery.envelope
        if not tracing.records(envelope.traceparent, provider=provider):
            return tracing.NO_SPAN
        attributes = _attributes(delivery, self.consumer.name, queue)
        return tracing.open_delivery_span(delivery.queue, envelope.traceparent, envelope.tracestate, attributes)

    @contextmanager
    def _handling(self, span: tracing.Span) -> Iterator[None]:
        """One delivery's handling in a shared transaction: current in its span, counted and timed."""
        with tracing.within(span), self._timed():
            yield

    @contextmanager
    def _timed(self) -> Iterator[None]:
        """One delivery's handling, alone or in a shared transaction: counted and timed."""
        self.metrics.handling(self.consumer.name)
        started = time.perf_counter()
        try:
            yield
        finally:
            self.metrics.handled(self.consumer.name, time.perf_counter() - started)

    def _settle(
        self,
        queue: QueuePort,
        delivery: Delivery,
        outcome: Outcome,
        done: list[Delivery],
        fields: dict[str, Any],
        span: tracing.Span,
    ) -> None:
        """Record ``outcome`` on the span and the stats; a success joins ``done`` (acked with the batch), the rest is settled now."""
        span.set_attribute("core_jobs.outcome", type(outcome).__name__.lower())
        if isinstance(outcome, RetryAfter):
            tracing.set_error(span, outcome.error, outcome.traceback)
        elif isinstance(outcome, DeadLettered):
            tracing.set_error(span, outcome.letter.last_error, outcome.letter.traceback)
        if isinstance(outcome, (Acked, Duplicate)):
            done.append(delivery)
            self.stats.add("processed" if isinstance(outcome, Acked) else "duplicates")
            if isinstance(outcome, Duplicate) and outcome.already_dead_lettered:  # a redelivery after a lost ack
                log.info("harness.job.already_dead_lettered", **fields)
            return
        if isinstance(outcome, Held):  # acked with the batch's successes: the execution waits for an operator
            done.append(delivery)
            self.stats.add("held")
            log.warning("harness.execution.held", **fields, execution_id=outcome.execution_id, reason=outcome.reason)
            return
        if isinstance(outcome, Stale):  # another worker owns the execution: settle nothing
            self.stats.add("stale")
            log.warning("harness.execution.stale", **fields, execution_id=outcome.execution_id)
            return
        if not settle(queue, delivery, outcome):
            self._lease_lost()
            log.warning("harness.job.lease_lost", **fields)
        elif isinstance(outcome, RetryAfter):
            self.stats.add("retried")
            log.info(
                "harness.job.retry_scheduled", **fields, delay_s=outcome.delay.total_seconds(), error=outcome.error
            )
        elif isinstance(outcome, DeadLettered):
            self.stats.add("dead_lettered")
            letter = outcome.letter
            if outcome.reason == "exhausted":  # retrying did not help: something is broken
                log.error(
                    "harness.job.dead_lettered",
                    **fields,
                    reason="exhausted",
                    error=letter.last_error,
                    traceback=letter.traceback,
                )
            else:  # poison or permanent: the schema's or the handler's own verdict on this job
                log.warning(
                    "harness.job.dead_lettered",
                    **fields,
                    reason=outcome.reason,
                    error=letter.last_error,
                    traceback=letter.traceback,
                )

    def _delivery_failed(
        self, conn: psycopg.Connection, queue: QueuePort, delivery: Delivery, error: Exception, fields: dict[str, Any]
    ) -> None:
        """An unexpected error while handling or settling ``delivery`` on a usable connection: that delivery's
        failure, not the worker's. It is retried after the policy's backoff (its attempt counted, the error its
        ``last_error``); if even that is refused, it waits out its lease. The batch goes on."""
        self.stats.add("failed")
        detail = describe_error(error)
        delay = self.config.lease  # if not even the retry can be recorded, the lease's expiry redelivers it
        try:
            delay = compute_delay(self.runtime.policy, delivery.attempt)
            if queue.retry(delivery, delay, detail):
                self.metrics.retry(self.consumer.name)
            else:
                self._lease_lost()
                log.warning("harness.job.lease_lost", **fields)
        except Exception as exc:
            if not _usable(conn):
                raise
            delay = self.config.lease
            detail = f"{detail}; its retry was refused too: {describe_error(exc)}"
        log.error(
            "harness.worker.delivery_failed",
            **fields,
            delay_s=delay.total_seconds(),
            error=detail,
            traceback=describe_traceback(error),
        )

    def _end_batch(
        self,
        conn: psycopg.Connection,
        queue: QueuePort,
        done: list[Delivery],
        unstarted: list[Delivery],
        rolled_back: Sequence[Delivery] = (),
        *,
        since: int | None = None,
    ) -> None:
        """Ack the batch's successes, release its unstarted messages and retry, counted, those whose work a failed
        shared transaction rolled back (``BatchProgress.rolled_back``, harness/handling.py); never raises.

        On the worker's connection while it is usable, else on a fresh one, through a port of the
        same adapter opened anew on it (and closed): a lost connection must not leave them leased
        until the lease expires, each with an attempt used. What cannot be done here, the lease
        expiry does later (the fence absorbs a redelivered success).

        On a broker, ``since`` (:func:`harness.replication.uncertain_commits` before the batch's commits): a commit
        that came back uncertain since then releases the successes instead of acking them.
        """
        if not done and not unstarted and not rolled_back:
            return
        guarded = self._barrier is not None and self._acks_outside and bool(done)
        checked = guarded or (since is not None and self._acks_outside and bool(done))
        try:
            if conn.info.transaction_status == TransactionStatus.IDLE:
                if checked:
                    done, unstarted = self._replicated_or_released(conn, done, unstarted, since)
                acked, released = queue.ack(done), queue.release(unstarted)
                self._retry_rolled_back(queue, rolled_back)
            else:  # closed or broken (a database outage, a terminated backend)
                if guarded:  # a failover may have lost the commits: a copy of each, and the fence decides
                    done, unstarted = [], unstarted + done
                with (
                    connect(
                        self.conninfo,
                        autocommit=True,
                        role=self.database_role,
                        primary_only=True,
                        application_name=self.application_name,
                        connect_timeout=GIVE_BACK_CONNECT_TIMEOUT_S,
                    ) as fresh,
                    closing(self._open_queue(fresh, getattr(queue, "worker", self.name))) as other,
                ):
                    acked, released = other.ack(done), other.release(unstarted)
                    self._retry_rolled_back(other, rolled_back)
        except Exception as exc:
            log.warning(
                "harness.worker.give_back_failed",
                consumer=self.consumer.name,
                num_unacked=len(done),
                num_unreleased=len(unstarted),
                error=describe_error(exc),
            )
            # Tried again on this thread's next connection (what a lease outlived by then comes back anyway); behind
            # the barrier, successes are released there: that connection cannot tell whether their commits survived.
            if guarded:
                done, unstarted = [], unstarted + done
            self._local.pending = [*getattr(self._local, "pending", []), (done, unstarted, rolled_back)]
            return
        self.stats.add("released", released)
        if acked < len(done):
            self._lease_lost(len(done) - acked)
            log.warning("harness.job.lease_lost", consumer=self.consumer.name, num_unacked=len(done) - acked)


ROLLED_BACK = (
    "RolledBack: its work was rolled back with the shared work transaction it was in, which failed (at a statement,"
    " at its commit or with its connection) before the job could run again alone"
)


def _fields(delivery: Delivery, consumer: str) -> dict[str, Any]:
    """The log fields of every event about ``delivery``."""
    return {
        "consumer": consumer,
        "job_id": str(delivery.envelope.job_id),
        "attempt": delivery.attempt,
        "correlation_id": delivery.envelope.correlation_id,
    }


def _attributes(delivery: Delivery, consumer: str, queue: QueuePort) -> dict[str, Any]:
    """The attributes of ``delivery``'s ``<queue> process`` span (OpenTelemetry's messaging conventions)."""
    envelope = delivery.envelope
    return {
        "messaging.system": getattr(queue, "system", None),
        "messaging.operation.type": "process",
        "messaging.destination.name": delivery.queue,
        "messaging.consumer.group.name": consumer,
        "messaging.message.id": delivery.receipt[0] if isinstance(delivery.receipt, tuple) else None,
        "messaging.message.conversation_id": envelope.correlation_id,
        "core_jobs.job_id": str(envelope.job_id),
        "core_jobs.attempt": delivery.attempt,
        "core_jobs.replay_of": envelope.replay_of,
    }


def _usable(conn: psycopg.Connection) -> bool:
    """Whether the worker's connection can go on after an error: open, and out of any transaction (one left
    open is rolled back here; a rollback that fails means the connection is gone)."""
    if conn.closed or conn.broken:
        return False
    if _idle(conn):
        return True
    try:
        conn.rollback()
    except psycopg.Error:
        return False
    return _idle(conn)  # read again: the rollback changed it


def _idle(conn: psycopg.Connection) -> bool:
    return conn.info.transaction_status == TransactionStatus.IDLE


class WorkerGroupError(RuntimeError):
    """One consumer's :class:`Worker` of a :class:`WorkerGroup` failed; the others were stopped. ``consumer`` names it."""

    def __init__(self, consumer: str, error: BaseException) -> None:
        super().__init__(f"consumer {consumer}: {describe_error(error)}")
        self.consumer = consumer
        self.error = error


class WorkerGroup:
    """Several consumers in one process: one :class:`Worker` per consumer, run side by side, stopped together.

    Each worker keeps its own queue, lease, threads, connections and metrics labels (the consumer's name);
    the group only runs each one's :meth:`Worker.run` in a thread of its own and shares the stopping:
    :meth:`stop` (or the ``stop`` event the workers were made with, which ``core-jobs worker`` passes to
    each and its SIGTERM/SIGINT handlers set) stops them all, and when one fails — its database
    unreachable for its ``reconnect_for``, a handler's ``KeyboardInterrupt`` — the others are stopped
    gracefully too, and :meth:`run` raises :class:`WorkerGroupError` naming that consumer (the first to
    fail), after every worker has stopped. With ``once`` each worker ends when its own queue has nothing ready.

    :meth:`health` is what ``core-jobs worker`` serves on ``/healthz``: ok while every consumer's worker runs.
    """

    def __init__(self, workers: Sequence[Worker]) -> None:
        if not workers:
            raise ValueError("a WorkerGroup needs at least one worker")
        names = [w.consumer.name for w in workers]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:  # two workers of one consumer in a process: raise its concurrency instead
            raise ValueError(f"consumer {', '.join(twice)} given more than once")
        self.workers = tuple(workers)
        self._lock = threading.Lock()
        self._states = dict.fromkeys(names, "starting")

    def stop(self) -> None:
        """Every worker finishes the message in hand, then stops (safe from a signal handler)."""
        for worker in self.workers:
            worker.stop()

    def health(self) -> tuple[bool, dict[str, Any]]:
        """(ok, body): ok while every consumer's worker runs; the body gives each one's state and queue."""
        with self._lock:
            states = dict(self._states)
        body = {
            "consumers": {
                w.consumer.name: {"queue": w.consumer.queue, "state": states[w.consumer.name]} for w in self.workers
            }
        }
        return all(s == "running" for s in states.values()), body

    def run(self, *, once: bool = False) -> dict[str, WorkerStats]:
        """Run every worker until stopped (or, with ``once``, until its queue has nothing ready); each one's counts."""
        failures: list[WorkerGroupError] = []
        results: dict[str, WorkerStats] = {}

        def run_one(worker: Worker) -> None:
            name = worker.consumer.name
            self._set(name, "running")
            try:
                results[name] = worker.run(once=once)
            except BaseException as exc:  # reported by run(), after every worker stopped
                with self._lock:
                    failures.append(WorkerGroupError(name, exc))
                    self._states[name] = "failed"
                self.stop()
            else:
                self._set(name, "stopped")

        threads = [
            threading.Thread(target=run_one, args=(w,), name=f"consumer-{w.consumer.name}") for w in self.workers
        ]
        for thread in threads:
            thread.start()
        waiting.join(threads)  # in the main thread, in slices: a SIGTERM another thread caught is handled
        if failures:
            raise failures[0]
        return results

    def _set(self, name: str, state: str) -> None:
        with self._lock:
            self._states[name] = state
