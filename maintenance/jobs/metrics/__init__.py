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

**Executions**. Per consumer: its durable executions in each state (every state, 0
included, once the consumer has any), and how long its oldest RECONCILIATION_REQUIRED one has
waited (seconds since it entered that state, by the run's ``now``). Succeeded executions are
deleted, so these are gauges of the work in hand.

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
``core_jobs_executions{consumer,status}``                    gauge    executions per state
``core_jobs_executions_oldest_reconciliation_age_seconds{consumer}`` gauge  oldest uncertain one
==========================================================  =======  ==============================

Events: ``maintenance.metrics.start/.stop/.error`` (fields ``num_successes``,
``num_consumers``, ``dead_letters_pending``, ``dead_letters_oldest_pending_age_seconds``,
``counted_until_lag_seconds``, ``executions_reconciliation_required``,
``executions_oldest_reconciliation_age_seconds``) and once per run ``maintenance.metrics.collected`` with every
figure above (``successes`` of this run and ``successes_total`` per consumer, ``dead_letters``
per queue, ``executions`` per consumer, ``counted_from``, ``counted_until``, ``horizon``).
"""
