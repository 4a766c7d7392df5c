"""The metrics job: the job class, its result and SPEC. The manual is docs/metrics.md."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from psycopg.types.json import Jsonb

from harness.enumerations import EXECUTION_STATUSES
from maintenance.jobs.base import JobEnv, JobSpec
from maintenance.jobs.metrics.settings import MetricsFields
from maintenance.jobs.metrics.sql import (
    ADVANCE_WATERMARK,
    COUNT_SUCCESSES,
    COUNT_SUCCESSES_BY_TENANT,
    DEAD_LETTER_FIGURES,
    ENSURE_WATERMARK,
    EXECUTION_FIGURES,
    LOCK_WATERMARK,
    RESOLUTION_FIGURES,
    SUCCESS_HORIZON,
)
from maintenance.runtime.logs import get_logger

WATERMARK = "success_volume"
OTHER_TENANTS = "other"
# A transaction takes its start time a moment before pg_stat_activity shows it; fences newer
# than this are left for the next run.
SETTLE = timedelta(seconds=1)
NEVER = datetime.min.replace(tzinfo=UTC)
# Every state a stored execution can be in (migration 0010; SUCCEEDED is never stored): each is
# exported for every consumer that has executions, 0 included, so a count that falls to zero
# shows 0 instead of a series that vanishes.
EXECUTION_STATES = EXECUTION_STATUSES  # harness/enumerations.py
UNCERTAIN = "RECONCILIATION_REQUIRED"


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


@dataclass(frozen=True)
class ConsumerExecutions:
    """One consumer's durable executions: how many in each state, and how long the oldest uncertain one has waited."""

    consumer: str
    by_status: dict[str, int]
    oldest_reconciliation_age_seconds: float | None

    @classmethod
    def from_rows(cls, now: datetime, rows: list[tuple[str, str, int, datetime]]) -> list[ConsumerExecutions]:
        """Rows (consumer, status, count, oldest_since) of EXECUTION_FIGURES, grouped by consumer."""
        grouped: dict[str, list[tuple[str, int, datetime]]] = {}
        for consumer, status, n, since in rows:
            grouped.setdefault(consumer, []).append((status, n, since))
        figures = []
        for consumer, states in sorted(grouped.items()):
            by_status = dict.fromkeys(EXECUTION_STATES, 0) | {status: n for status, n, _ in states}
            oldest = next((since for status, _, since in states if status == UNCERTAIN), None)
            figures.append(cls(consumer, by_status, _age(now, oldest)))
        return figures


@dataclass
class MetricsResult:
    counted_from: datetime
    counted_until: datetime
    horizon: str
    now: datetime
    successes: dict[str, int] = field(default_factory=dict)
    totals: dict[str, dict[str, Any]] = field(default_factory=dict)
    dead_letters: list[QueueFigures] = field(default_factory=list)
    executions: list[ConsumerExecutions] = field(default_factory=list)
    resolutions: dict[tuple[str, str], int] = field(default_factory=dict)  # (consumer, command) -> total
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
            "executions_reconciliation_required": sum(c.by_status[UNCERTAIN] for c in self.executions),
            "executions_oldest_reconciliation_age_seconds": max(
                (c.oldest_reconciliation_age_seconds or 0.0 for c in self.executions), default=0.0
            ),
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
            "executions": {
                c.consumer: c.by_status | {"oldest_reconciliation_age_seconds": c.oldest_reconciliation_age_seconds}
                for c in self.executions
            },
            "resolutions_total": {f"{consumer}/{command}": n for (consumer, command), n in self.resolutions.items()},
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
        yield from self._execution_families()

    def _execution_families(self) -> Iterator[Metric]:
        states = GaugeMetricFamily(
            "core_jobs_executions",
            "Durable executions not finished (succeeded ones are deleted), by consumer and state.",
            labels=["consumer", "status"],
        )
        oldest = GaugeMetricFamily(
            "core_jobs_executions_oldest_reconciliation_age_seconds",
            "How long the oldest RECONCILIATION_REQUIRED execution has waited for an operator.",
            labels=["consumer"],
        )
        for c in self.executions:
            for status, n in c.by_status.items():
                states.add_metric([c.consumer, status], n)
            if c.oldest_reconciliation_age_seconds is not None:
                oldest.add_metric([c.consumer], c.oldest_reconciliation_age_seconds)
        yield from (states, oldest)
        resolutions = CounterMetricFamily(
            "core_jobs_execution_resolutions",
            "Operator resolutions of RECONCILIATION_REQUIRED executions (the append-only ledger), by consumer and command.",
            labels=["consumer", "command"],
        )
        for (consumer, command), n in self.resolutions.items():
            resolutions.add_metric([consumer, command], n)
        yield resolutions


def zero_fields() -> dict[str, Any]:
    """The result fields of a run that counted nothing: the same keys as ``MetricsResult.fields()``."""
    return MetricsResult(counted_from=NEVER, counted_until=NEVER, horizon="", now=NEVER).fields()


# --- the job -----------------------------------------------------------------------------------
class MetricsJob:
    """Counts success volume since the watermark and reads the dead-letter figures; ``settings`` were validated by
    pydantic (``MetricsFields(metrics_tenant_top_n=2)`` in code)."""

    def __init__(self, settings: MetricsFields, env: JobEnv) -> None:
        self.settings = settings
        self.db = env.db

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
                result.executions = ConsumerExecutions.from_rows(now, conn.execute(EXECUTION_FIGURES).fetchall())
                result.resolutions = {(c, command): n for c, command, n in conn.execute(RESOLUTION_FIGURES)}
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
            now, oldest_open, hidden=hidden, prepared=prepared, max_transaction=self.settings.metrics_max_transaction
        )
        until = max(since, horizon)  # never backwards
        counts: dict[tuple[str, str | None], int] = {}
        if until > since:
            count = COUNT_SUCCESSES_BY_TENANT if self.settings.metrics_tenant_label else COUNT_SUCCESSES
            rows = conn.execute(count, {"since": since, "until": until})
            counts = {(consumer, t): n for consumer, t, n in rows}
        totals = add_counts(
            totals or {},
            counts,
            tenant_label=self.settings.metrics_tenant_label,
            top_n=self.settings.metrics_tenant_top_n,
        )
        conn.execute(ADVANCE_WATERMARK, {"until": until, "totals": Jsonb(totals), "now": now, **params})
        successes: dict[str, int] = {}
        for (consumer, _tenant), n in counts.items():
            successes[consumer] = successes.get(consumer, 0) + n
        return MetricsResult(since, until, why, now, successes, totals, tenant_label=self.settings.metrics_tenant_label)


def _age(now: datetime, oldest: datetime | None) -> float | None:
    return None if oldest is None else max(0.0, round((now - oldest).total_seconds(), 3))


# --- registration ------------------------------------------------------------------------------
SPEC = JobSpec[MetricsFields](
    name="metrics",
    summary="success volume per consumer and dead-letter gauges, as Prometheus metrics and a log event",
    settings=MetricsFields,
    build=MetricsJob,
    zero_fields=zero_fields,
)
