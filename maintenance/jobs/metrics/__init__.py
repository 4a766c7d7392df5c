"""The metrics job: success volume per consumer, dead-letter and execution gauges, as Prometheus metrics.

Why a job and not rows: successes at volume are metrics, never rows (J-B9). So this job counts
the idempotency fences consumers already write (``core.processed_jobs``) and writes nothing but
its own watermark row (``core.metrics_watermark``), where the cumulative totals live so that a
counter stays a counter when every run is a new process. The watermark follows the oldest
transaction still open, not the newest fence, because a fence becomes visible at commit but
carries its transaction's start: none is missed, none counted twice.

The operator's manual — how counting survives late commits and its bounds, the tenant label,
every metric, the BRIN index, the options (generated from settings.py), the events and the
failure modes — is docs/metrics.md, written once there.
"""

# The parts, the same in every job: settings.py (its settings, declared once: the job's
# configuration), sql.py (the named SQL), job.py (the run, MetricsResult, and SPEC).
