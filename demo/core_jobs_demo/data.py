"""Realistic rows for ``core-jobs demo``, placed on both sides of every cutoff the jobs use.

Times are relative to PostgreSQL's ``now()``, so the story is the same whenever it runs.
"""

from __future__ import annotations

from maintenance.runtime.db import Database

# Each block is one kind of row; the comment says why it exists in the story.
SEED_SQL = {
    # Old fences whose TTL passed long ago: the purge deletes these.
    "fences_expired": """
        INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, processed_at, expires_at)
        SELECT gen_random_uuid(), (ARRAY['points.credit', 'points.expire', 'notifications.email'])[1 + g % 3],
               ('00000000-0000-4000-8000-' || lpad(to_hex(g % 7), 12, '0'))::uuid,
               now() - interval '10 days' - g * interval '1 minute',
               now() - interval '3 days' - g * interval '1 minute'
          FROM generate_series(1, 240) AS g""",
    # Fresh fences: processed in the last hour, expiring in 7 days.
    "fences_fresh": """
        INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, processed_at, expires_at)
        SELECT gen_random_uuid(), (ARRAY['points.credit', 'points.expire'])[1 + g % 2],
               ('00000000-0000-4000-8000-' || lpad(to_hex(g % 7), 12, '0'))::uuid,
               now() - g * interval '1 minute', now() + interval '7 days' - g * interval '1 minute'
          FROM generate_series(1, 60) AS g""",
    # A misconfigured consumer wrote a 1-minute TTL: expired, but still inside the retry window.
    "fences_short_ttl": """
        INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, processed_at, expires_at)
        SELECT gen_random_uuid(), 'legacy.export', '00000000-0000-4000-8000-000000000001',
               now() - interval '5 minutes', now() - interval '4 minutes'
          FROM generate_series(1, 8) AS g""",
    # Expired fences of jobs that also sit in dead letters pending review: a replay needs them.
    "fences_with_pending_dead_letter": """
        WITH f AS (
            INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, processed_at, expires_at)
            SELECT gen_random_uuid(), 'points.credit', '00000000-0000-4000-8000-000000000002',
                   now() - interval '9 days', now() - interval '2 days'
              FROM generate_series(1, 4)
            RETURNING job_id, tenant_id
        )
        INSERT INTO core.dead_letters (job_id, queue, payload, attempts, last_error, correlation_id, tenant_id, consumer, created_at)
        SELECT job_id, 'points.credit', jsonb_build_object('member_id', 'm-' || left(job_id::text, 8), 'points', 50),
               5, 'ProviderTimeout: loyalty ledger did not answer in 10 s', 'corr-' || left(job_id::text, 8),
               tenant_id, 'points.credit', now() - interval '2 hours'
          FROM f""",
    # New dead letters, minutes old, across two queues: the alert feed raises incidents.
    "dead_letters_new": """
        INSERT INTO core.dead_letters (job_id, queue, payload, attempts, last_error, correlation_id, tenant_id, consumer, created_at)
        SELECT gen_random_uuid(), q.queue,
               jsonb_build_object('member_id', 'm-' || g, 'points', 10 * g),
               CASE WHEN g % 4 = 0 THEN 1 ELSE 5 END,
               CASE WHEN g % 4 = 0 THEN 'PoisonMessage: payload failed schema validation: points must be >= 0'
                    ELSE 'ProviderUnavailable: HTTP 503 from loyalty ledger' END,
               'corr-new-' || g, '00000000-0000-4000-8000-000000000003', q.queue,
               now() - g * interval '2 minutes'
          FROM generate_series(1, 12) AS g
          CROSS JOIN (VALUES ('points.credit'), ('notifications.email')) AS q(queue)
         WHERE q.queue = 'points.credit' OR g <= 3""",
    # Dead letters nobody reviewed for 5 days: past the 3-day staleness, they escalate.
    "dead_letters_stale": """
        INSERT INTO core.dead_letters (job_id, queue, payload, attempts, last_error, correlation_id, tenant_id, consumer, created_at)
        SELECT gen_random_uuid(), 'points.expire', jsonb_build_object('member_id', 'm-old-' || g, 'batch', '2026-11'),
               5, 'DeadlockDetected: deadlock detected while expiring points', 'corr-stale-' || g,
               '00000000-0000-4000-8000-000000000004', 'points.expire', now() - interval '5 days' - g * interval '1 hour'
          FROM generate_series(1, 4) AS g""",
    # Handled history: replayed and discarded dead letters. Inserted pending, then reviewed in a
    # second statement: an UPDATE cannot see rows that its own statement's CTE inserted. The
    # replays' deliveries were processed long ago (a third statement: the outcome follows the replay).
    "dead_letters_handled": """
        INSERT INTO core.dead_letters (job_id, queue, payload, attempts, last_error, correlation_id, created_at)
        SELECT gen_random_uuid(), 'points.credit', jsonb_build_object('member_id', 'm-h-' || g, 'points', 5),
               5, 'ProviderUnavailable: HTTP 503 from loyalty ledger', 'corr-h-' || g, now() - interval '8 days'
          FROM generate_series(1, 8) AS g;
        UPDATE core.dead_letters
           SET status = CASE WHEN right(correlation_id, 1)::int % 3 = 0 THEN 'discarded' ELSE 'replayed' END,
               discard_reason = CASE WHEN right(correlation_id, 1)::int % 3 = 0
                                     THEN 'duplicate of a manual credit, ticket OPS-1422' END
         WHERE correlation_id LIKE 'corr-h-%';
        UPDATE core.dead_letters SET replay_outcome = 'processed'
         WHERE correlation_id LIKE 'corr-h-%' AND status = 'replayed'""",
}

STORY = {
    "fences_expired": "240 fences whose TTL passed 3+ days ago (purgeable)",
    "fences_fresh": "60 fresh fences expiring in 7 days",
    "fences_short_ttl": "8 fences written with a 1-minute TTL 5 minutes ago (expired, but inside the retry window)",
    "fences_with_pending_dead_letter": "4 expired fences whose job has a dead letter pending review (a replay needs them)",
    "dead_letters_new": "15 new dead letters: 12 in points.credit (16 with the 4 above), 3 in notifications.email",
    "dead_letters_stale": "4 dead letters in points.expire unreviewed for 5 days (stale)",
    "dead_letters_handled": "8 handled dead letters: 6 replayed, 2 discarded with a reason",
}


def seed(db: Database) -> list[str]:
    """Insert the demo rows in one transaction; return the story, one line per kind of row."""
    with db.connect() as conn:
        for statement in SEED_SQL.values():
            conn.execute(statement)
    return [STORY[name] for name in SEED_SQL]
