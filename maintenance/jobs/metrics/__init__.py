"""The metrics job: success volume per consumer and dead-letter gauges, as Prometheus metrics.

Successes at volume are metrics, never rows (J-B9): this job counts the idempotency fences
that consumers already write (``core.processed_jobs``), and writes nothing but its own
watermark row (``core.metrics_watermark``).

**Success volume.** Each run counts the fences with ``counted_until(previous) <= processed_at
< counted_until(new)`` per consumer, adds them to cumulative totals kept in the watermark row
and advances the watermark, all in one transaction that holds the watermark row locked (two
replicas serialise; the second counts only what is new). Totals survive restarts, so
``core_jobs_successes_total`` is a true counter even when every run is a new process.

*Late commits.* A fence's ``processed_at`` is ``now()`` of its work transaction — the
transaction's **start** — but it becomes visible at **commit**. A transaction that started
before a committed fence can commit after it, with an older ``processed_at``. A watermark
that simply followed the newest ``processed_at`` would skip it. The new watermark is
therefore the start of the oldest transaction still open in this database (from
``pg_stat_activity``; every fence still to come has ``processed_at`` at or after it), and at
most ``now - 1 s`` (the gap between a transaction taking its start time and publishing it).
Counts arrive about a second late rather than a whole safety lag late, and none is missed or
counted twice. Two bounds keep that honest:

* a transaction open longer than ``METRICS_MAX_TRANSACTION`` does not hold the watermark back
  further (it is assumed not to be a consumer's work — e.g. a forgotten psql session);
* when this role cannot see every session's start (no ``pg_read_all_stats``) or a prepared
  (two-phase) transaction exists, the watermark is ``now - METRICS_MAX_TRANSACTION``: the plain
  safety lag.

So the guarantee is exact as long as no work transaction outlives ``METRICS_MAX_TRANSACTION``
and consumers keep the default ``processed_at = now()``. The purge deletes fences only after
their TTL (``PROCESSED_JOBS_TTL``, days), so none disappears before it is counted — unless this
job has not run for that long: fences purged meanwhile are never counted.

**Tenants** (``METRICS_TENANT_LABEL``): each consumer's counter is split by tenant, with at most
``METRICS_TENANT_TOP_N`` named tenants and the rest summed as ``tenant="other"``. A slot, once
given to a tenant (the largest new tenants of a run get free slots first), is kept, so every
series only ever grows; lowering TOP_N drops the smallest named tenants into ``other``. To
re-rank, delete the watermark row (counters restart from the fences still stored).

**Dead letters.** Per queue: pending, the age of the oldest pending one (seconds, by the
run's ``now``), and replayed and discarded totals (dead letters are never deleted, so these are
true counters).

Options (environment, ``CORE_JOBS_`` prefix):

=============================  ========  =======  ===============================================
setting                        unit      default  meaning
=============================  ========  =======  ===============================================
METRICS_MAX_TRANSACTION        duration  PT5M     longest work transaction of a consumer
METRICS_TENANT_LABEL           bool      false    split success counters by tenant
METRICS_TENANT_TOP_N           count     10       named tenants per consumer (1-100)
METRICS_PUSHGATEWAY_URL        URL       unset    push every run's metrics (maintenance/runtime/telemetry.py)
=============================  ========  =======  ===============================================

Metrics (besides the run metrics every job gets, see maintenance/runtime/telemetry.py):

==========================================================  =======  ==============================
``core_jobs_successes_total{consumer[,tenant]}``            counter  fences counted, cumulative
``core_jobs_successes_counted_until_timestamp_seconds``     gauge    the watermark (Unix time)
``core_jobs_dead_letters_pending{queue}``                   gauge    dead letters pending review
``core_jobs_dead_letters_oldest_pending_age_seconds{queue}`` gauge   age of the oldest pending one
``core_jobs_dead_letters_replayed_total{queue}``            counter  dead letters replayed
``core_jobs_dead_letters_discarded_total{queue}``           counter  dead letters discarded
==========================================================  =======  ==============================

Events: ``maintenance.metrics.start/.stop/.error`` (fields ``num_successes``,
``num_consumers``, ``dead_letters_pending``, ``dead_letters_oldest_pending_age_seconds``,
``counted_until_lag_seconds``) and once per run ``maintenance.metrics.collected`` with every
figure above (``successes`` of this run and ``successes_total`` per consumer, ``dead_letters``
per queue, ``counted_from``, ``counted_until``, ``horizon``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from psycopg.types.json import Jsonb

from maintenance.jobs.base import JobSpec
from maintenance.runtime.db import Database
from maintenance.runtime.logs import get_logger
from maintenance.settings import ConfigError, Settings

WATERMARK = "success_volume"
OTHER_TENANTS = "other"
# A transaction takes its start time a moment before pg_stat_activity shows it; fences newer
# than this are left for the next run.
SETTLE = timedelta(seconds=1)
NEVER = datetime.min.replace(tzinfo=UTC)


# --- config ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MetricsConfig:
    """What the metrics job needs; defaults match the settings'."""

    max_transaction: timedelta = timedelta(minutes=5)
    tenant_label: bool = False
    tenant_top_n: int = 10

    @classmethod
    def from_settings(cls, settings: Settings) -> MetricsConfig:
        return cls(settings.metrics_max_transaction, settings.metrics_tenant_label, settings.metrics_tenant_top_n)


# --- SQL ---------------------------------------------------------------------------------------
# Make sure the watermark row exists (it is seeded by the migration; an operator may delete it
# to restart the counters), then lock it: concurrent runs serialise here.
ENSURE_WATERMARK = """
INSERT INTO core.metrics_watermark (name) VALUES (%(name)s)
ON CONFLICT (name) DO NOTHING
"""
LOCK_WATERMARK = """
SELECT counted_until, totals FROM core.metrics_watermark WHERE name = %(name)s FOR UPDATE
"""

# success_horizon: where counting may stop. Every transaction open in this database started at
# or after oldest_open, so every fence still to come has processed_at >= oldest_open. `hidden`
# counts sessions whose start this role may not see; `prepared` two-phase transactions (no
# backend, no start time). Autovacuum never writes fences. Runs BEFORE count_successes, which
# (READ COMMITTED) takes a newer snapshot: a transaction gone from this list is visible there.
SUCCESS_HORIZON = """
SELECT min(a.xact_start) AS oldest_open,
       count(*) FILTER (WHERE NOT pg_has_role('pg_read_all_stats', 'USAGE')
                          AND NOT coalesce(pg_has_role(a.usesysid, 'USAGE'), true)) AS hidden,
       (SELECT count(*) FROM pg_prepared_xacts p WHERE p.database = current_database()) AS prepared
  FROM pg_stat_activity a
 WHERE a.datname = current_database()
   AND a.pid <> pg_backend_pid()
   AND a.backend_type IS DISTINCT FROM 'autovacuum worker'  -- NULL for a hidden session: keep it
"""

# count_successes: the fences between the old and the new watermark (half-open, so a fence on
# the boundary is counted exactly once). Served by the processed_at index (migration 0004).
COUNT_SUCCESSES = """
SELECT consumer, {tenant} AS tenant, count(*) AS n
  FROM core.processed_jobs
 WHERE processed_at >= %(since)s AND processed_at < %(until)s
 GROUP BY 1, 2
"""

ADVANCE_WATERMARK = """
UPDATE core.metrics_watermark SET counted_until = %(until)s, totals = %(totals)s, updated_at = %(now)s
 WHERE name = %(name)s
"""

# dead_letter_figures: per queue; handled dead letters are never deleted, so their counts only grow.
DEAD_LETTER_FIGURES = """
SELECT queue,
       count(*) FILTER (WHERE status = 'pending_review') AS pending,
       min(created_at) FILTER (WHERE status = 'pending_review') AS oldest_pending_at,
       count(*) FILTER (WHERE status = 'replayed') AS replayed,
       count(*) FILTER (WHERE status = 'discarded') AS discarded
  FROM core.dead_letters
 GROUP BY queue
 ORDER BY queue
"""


# --- pure parts --------------------------------------------------------------------------------
def choose_horizon(
    now: datetime, oldest_open: datetime | None, *, hidden: int, prepared: int, max_transaction: timedelta
) -> tuple[datetime, str]:
    """The new watermark candidate and why: ``open_transaction``, ``settle`` or ``max_transaction``."""
    floor = now - max_transaction
    if hidden or prepared:
        return floor, "max_transaction"
    if oldest_open is not None and oldest_open < now - SETTLE:
        if oldest_open <= floor:
            return floor, "max_transaction"
        return oldest_open, "open_transaction"
    return now - SETTLE, "settle"


def add_counts(
    totals: Mapping[str, Any], counts: Mapping[tuple[str, str | None], int], *, tenant_label: bool, top_n: int
) -> dict[str, dict[str, Any]]:
    """New cumulative totals: ``{consumer: {"total": n, "tenants": {tenant: n}}}``.

    Named tenants per consumer are capped at ``top_n``; tenants without a slot are the
    difference ``total - sum(named)`` (exported as ``other``).
    """
    result: dict[str, dict[str, Any]] = {
        c: {"total": int(v.get("total", 0)), "tenants": dict(v.get("tenants", {}))} for c, v in totals.items()
    }
    by_consumer: dict[str, dict[str | None, int]] = {}
    for (consumer, tenant), n in counts.items():
        by_consumer.setdefault(consumer, {})[tenant] = n
    for consumer, tenants in by_consumer.items():
        entry = result.setdefault(consumer, {"total": 0, "tenants": {}})
        entry["total"] += sum(tenants.values())
        if not tenant_label:
            continue
        named = entry["tenants"]
        if len(named) > top_n:  # TOP_N was lowered: keep the largest
            named = dict(sorted(named.items(), key=lambda kv: (-kv[1], kv[0]))[:top_n])
        for tenant, n in sorted(tenants.items(), key=lambda kv: (-kv[1], str(kv[0]))):
            if tenant in named:
                named[tenant] += n
            elif len(named) < top_n:
                named[tenant] = n
        entry["tenants"] = named
    return result


# --- result ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class QueueFigures:
    queue: str
    pending: int
    oldest_pending_age_seconds: float | None
    replayed: int
    discarded: int


@dataclass
class MetricsResult:
    counted_from: datetime
    counted_until: datetime
    horizon: str
    now: datetime
    successes: dict[str, int] = field(default_factory=dict)
    totals: dict[str, dict[str, Any]] = field(default_factory=dict)
    dead_letters: list[QueueFigures] = field(default_factory=list)
    tenant_label: bool = False
    ok: bool = True

    def fields(self) -> dict[str, Any]:
        ages = [q.oldest_pending_age_seconds for q in self.dead_letters if q.oldest_pending_age_seconds is not None]
        return {
            "num_successes": sum(self.successes.values()),
            "num_consumers": len(self.totals),
            "dead_letters_pending": sum(q.pending for q in self.dead_letters),
            "dead_letters_oldest_pending_age_seconds": max(ages, default=0.0),
            "counted_until_lag_seconds": round((self.now - self.counted_until).total_seconds(), 3),
        }

    def totals_by_series(self) -> dict[tuple[str, ...], int]:
        """Cumulative successes per exported label set: (consumer,) or (consumer, tenant)."""
        series: dict[tuple[str, ...], int] = {}
        for consumer, entry in sorted(self.totals.items()):
            if not self.tenant_label:
                series[(consumer,)] = entry["total"]
                continue
            for tenant, n in sorted(entry["tenants"].items()):
                series[(consumer, tenant)] = n
            series[(consumer, OTHER_TENANTS)] = entry["total"] - sum(entry["tenants"].values())
        return series

    def log_figures(self) -> dict[str, Any]:
        """The figures of the ``maintenance.metrics.collected`` event."""
        return {
            "counted_from": None if self.counted_from == NEVER else self.counted_from.isoformat(),
            "counted_until": self.counted_until.isoformat(),
            "horizon": self.horizon,
            "successes": dict(sorted(self.successes.items())),
            "successes_total": {"/".join(k): v for k, v in self.totals_by_series().items()},
            "dead_letters": {
                q.queue: {
                    "pending": q.pending,
                    "oldest_pending_age_seconds": q.oldest_pending_age_seconds,
                    "replayed_total": q.replayed,
                    "discarded_total": q.discarded,
                }
                for q in self.dead_letters
            },
        }

    def metric_families(self) -> Iterator[Metric]:
        labels = ["consumer", "tenant"] if self.tenant_label else ["consumer"]
        successes = CounterMetricFamily(
            "core_jobs_successes",
            "Jobs processed successfully (idempotency fences counted), cumulative.",
            labels=labels,
        )
        for key, n in self.totals_by_series().items():
            successes.add_metric(list(key), n)
        yield successes
        yield GaugeMetricFamily(
            "core_jobs_successes_counted_until_timestamp_seconds",
            "Fences with processed_at before this Unix time are counted in core_jobs_successes_total.",
            value=self.counted_until.timestamp(),
        )
        pending = GaugeMetricFamily("core_jobs_dead_letters_pending", "Dead letters pending review.", labels=["queue"])
        age = GaugeMetricFamily(
            "core_jobs_dead_letters_oldest_pending_age_seconds",
            "Age of the oldest dead letter pending review.",
            labels=["queue"],
        )
        replayed = CounterMetricFamily("core_jobs_dead_letters_replayed", "Dead letters replayed.", labels=["queue"])
        discarded = CounterMetricFamily("core_jobs_dead_letters_discarded", "Dead letters discarded.", labels=["queue"])
        for q in self.dead_letters:
            pending.add_metric([q.queue], q.pending)
            if q.oldest_pending_age_seconds is not None:
                age.add_metric([q.queue], q.oldest_pending_age_seconds)
            replayed.add_metric([q.queue], q.replayed)
            discarded.add_metric([q.queue], q.discarded)
        yield from (pending, age, replayed, discarded)


def zero_fields() -> dict[str, Any]:
    """The result fields of a run that counted nothing: the same keys as ``MetricsResult.fields()``."""
    return MetricsResult(counted_from=NEVER, counted_until=NEVER, horizon="", now=NEVER).fields()


# --- the job -----------------------------------------------------------------------------------
class MetricsJob:
    """Counts success volume since the watermark and reads the dead-letter figures."""

    def __init__(self, db: Database, config: MetricsConfig | None = None) -> None:
        config = config or MetricsConfig()
        if config.max_transaction <= timedelta(0):
            raise ConfigError("CORE_JOBS_METRICS_MAX_TRANSACTION: must be positive")
        if not 1 <= config.tenant_top_n <= 100:
            raise ConfigError("CORE_JOBS_METRICS_TENANT_TOP_N: must be between 1 and 100")
        self.db = db
        self.config = config

    def run_once(self, now: datetime) -> MetricsResult:
        """Count the successes since the watermark and read the dead-letter figures, as of ``now``.

        ``now`` is PostgreSQL's clock read by the runner just before; the watermark never passes
        ``now - 1 s``. (Tests pass a later ``now`` to stand for a later run.)
        """
        with self.db.connect() as conn:
            # READ COMMITTED whatever the server's default: count_successes must take its own
            # snapshot, after success_horizon (a single snapshot for the whole transaction, as in
            # REPEATABLE READ, could miss a fence committed between the two).
            conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
            with conn.transaction():
                result = self._count_successes(conn, now)
                result.dead_letters = [
                    QueueFigures(queue, pending, _age(now, oldest), replayed, discarded)
                    for queue, pending, oldest, replayed, discarded in conn.execute(DEAD_LETTER_FIGURES)
                ]
        get_logger(job="metrics").info("maintenance.metrics.collected", **result.log_figures())
        return result

    def _count_successes(self, conn: psycopg.Connection, now: datetime) -> MetricsResult:
        """Lock the watermark, count up to the new horizon, store the totals and the new watermark."""
        params = {"name": WATERMARK}
        conn.execute(ENSURE_WATERMARK, params)
        watermark = conn.execute(LOCK_WATERMARK, params).fetchone()
        assert watermark is not None  # ENSURE_WATERMARK just made sure the row exists
        since, totals = watermark
        since = NEVER if since is None else since  # NULL: nothing counted yet
        horizon_row = conn.execute(SUCCESS_HORIZON).fetchone()
        assert horizon_row is not None  # aggregates: always one row
        oldest_open, hidden, prepared = horizon_row
        horizon, why = choose_horizon(
            now, oldest_open, hidden=hidden, prepared=prepared, max_transaction=self.config.max_transaction
        )
        until = max(since, horizon)  # never backwards
        counts: dict[tuple[str, str | None], int] = {}
        if until > since:
            tenant = "tenant_id::text" if self.config.tenant_label else "NULL::text"
            rows = conn.execute(COUNT_SUCCESSES.format(tenant=tenant), {"since": since, "until": until})
            counts = {(consumer, t): n for consumer, t, n in rows}
        totals = add_counts(totals or {}, counts, tenant_label=self.config.tenant_label, top_n=self.config.tenant_top_n)
        conn.execute(ADVANCE_WATERMARK, {"until": until, "totals": Jsonb(totals), "now": now, **params})
        successes: dict[str, int] = {}
        for (consumer, _tenant), n in counts.items():
            successes[consumer] = successes.get(consumer, 0) + n
        return MetricsResult(since, until, why, now, successes, totals, tenant_label=self.config.tenant_label)


def _age(now: datetime, oldest: datetime | None) -> float | None:
    return None if oldest is None else max(0.0, round((now - oldest).total_seconds(), 3))


# --- registration ------------------------------------------------------------------------------
def demo_lines(db: Database, result: MetricsResult) -> list[str]:
    figures = result.log_figures()
    lines = [
        f"counted {sum(result.successes.values())} successes up to {figures['counted_until']} (horizon: {result.horizon});"
        " the watermark row is the only row written",
    ]
    lines += [f'core_jobs_successes_total{{consumer="{k}"}} {v}' for k, v in figures["successes_total"].items()]
    for q in result.dead_letters:
        lines.append(
            f"queue {q.queue}: {q.pending} pending (oldest {q.oldest_pending_age_seconds or 0:.0f} s),"
            f" {q.replayed} replayed, {q.discarded} discarded"
        )
    return lines


SPEC = JobSpec(
    name="metrics",
    summary="success volume per consumer and dead-letter gauges, as Prometheus metrics and a log event",
    build=lambda settings, db: MetricsJob(db, MetricsConfig.from_settings(settings)),
    zero_fields=zero_fields,
    demo_lines=demo_lines,
)
