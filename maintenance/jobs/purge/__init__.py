"""The purge: deletes expired ``core.processed_jobs`` fences in short batches.

Why it is careful: a fence deleted too soon lets a late retry, a broker redelivery, a replay or a
durable execution's redelivery apply the work twice; a fence kept for ever grows the table
without end. So a fence goes only when four rules all hold — its TTL passed, past every retry
window (J-AC6), no dead letter holds it (``core.holds_fence``), no unfinished durable execution
needs it — on PostgreSQL's clock read once per run; the run refuses to start when the TTL is
shorter than the retry window it must outlive (J-B7); and it deletes in short transactions aimed
at a target wall time, along whichever of two access paths (paths.py) it estimates cheaper, so
the application never waits on it (NF-6..NF-9).

The operator's manual — the four rules and the races they cover, both paths and how auto picks,
the batch steering, the options (generated from settings.py), the events and the failure
modes — is docs/purge.md, written once there.
"""

# The parts, the same in every job: settings.py (its settings, declared once: the job's
# configuration), sql.py (the named SQL), paths.py (the two access paths), job.py
# (Purger.run_once -> PurgeResult, and SPEC).
