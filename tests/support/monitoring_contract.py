"""The metric names the alert rules and the dashboard may query: issue 21's names contract.

One list, read by tests/monitoring/test_monitoring.py. Issue 21's metrics part implements the names marked
``exists=False`` in parallel; once merged, this list should give way to the exporters' own
registries (or the generated metrics reference), and every name becomes ``exists=True``. A name
marked ``exists=True`` is checked against a real scrape of ``serve``'s and the API's /metrics.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    name: str  # the family name, as prometheus_client's parser gives it (no _total)
    kind: str  # counter, gauge or histogram
    exists: bool  # exported by today's code (serve or the API)

    def series(self) -> set[str]:
        """The sample names PromQL can query for this family."""
        if self.kind == "counter":
            return {f"{self.name}_total"}
        if self.kind == "histogram":
            return {f"{self.name}_bucket", f"{self.name}_count", f"{self.name}_sum"}
        return {self.name}


CONTRACT = (
    # every job (label job_name)
    Family("core_jobs_job_runs", "counter", True),
    Family("core_jobs_job_duration_seconds", "gauge", True),
    Family("core_jobs_job_last_success_timestamp_seconds", "gauge", True),
    # the purge, the alerts job (replacing core_jobs_job_result{field})
    Family("core_jobs_purge_rows_deleted", "gauge", False),
    Family("core_jobs_purge_rows_left", "gauge", False),
    Family("core_jobs_purge_longest_batch_seconds", "gauge", False),
    Family("core_jobs_purge_batches", "gauge", False),
    Family("core_jobs_alerts_incidents_opened", "gauge", False),
    Family("core_jobs_alerts_incidents_resolved", "gauge", False),
    Family("core_jobs_alerts_escalations", "gauge", False),
    # the metrics job
    Family("core_jobs_successes", "counter", True),
    Family("core_jobs_dead_letters_pending", "gauge", True),
    Family("core_jobs_dead_letters_oldest_pending_age_seconds", "gauge", True),
    Family("core_jobs_executions", "gauge", True),
    Family("core_jobs_executions_oldest_reconciliation_age_seconds", "gauge", True),
    Family("core_jobs_execution_resolutions", "counter", True),
    # the worker (harness; label consumer or queue)
    Family("harness_jobs_processed", "counter", True),
    Family("harness_jobs_retries", "counter", True),
    Family("harness_jobs_dead_lettered", "counter", True),
    Family("harness_jobs_duplicates", "counter", True),
    Family("harness_handler_duration_seconds", "histogram", False),
    Family("harness_jobs_in_flight", "gauge", False),
    Family("harness_queue_depth", "gauge", False),
    Family("harness_queue_oldest_ready_age_seconds", "gauge", False),
    Family("harness_leases_lost", "counter", False),
    # the operations API
    Family("core_jobs_api_requests", "counter", True),
    Family("core_jobs_api_request_duration_seconds", "histogram", True),
)

# Series Prometheus makes itself, not an exporter.
PROMETHEUS_OWN = frozenset({"up"})


def contract_series() -> set[str]:
    return {name for family in CONTRACT for name in family.series()}
