"""The consumer harness's part of ``core-jobs demo``: the example points consumer, told as a story.

Enqueue three credits and a duplicate delivery, a poison payload, a credit whose provider times
out twice and then recovers, and one whose provider stays down until it is dead-lettered; then
an operator replays the dead letter and discards the poison. Retry delays are real and on
PostgreSQL's clock; the demo fast-forwards through them by moving the scheduled ``run_at`` to
now, as the tests do.
"""

from __future__ import annotations

import uuid
from typing import TextIO

from prometheus_client import CollectorRegistry

from harness.examples.points import OutageLedger, make_consumer
from harness.metrics import HarnessMetrics
from harness.queue.pgqueue import PgQueue
from harness.queue.port import Envelope
from harness.worker import Worker, WorkerConfig
from maintenance.operations.dead_letters import discard, replay
from maintenance.runtime.db import Database
from maintenance.settings import Settings

TENANT = uuid.UUID("00000000-0000-4000-8000-0000000000d0")
QUEUE = "points.credit"
OPERATOR = "demo-operator"


def walk_through(settings: Settings, db: Database, out: TextIO) -> None:
    """Run the story on ``db`` (migrated), writing one line per step to ``out``."""
    metrics = HarnessMetrics(CollectorRegistry())
    config = WorkerConfig(
        fence_ttl=settings.processed_jobs_ttl, lease=settings.worker_lease, batch_size=settings.worker_batch_size
    )
    outage = make_consumer(OutageLedger(timeouts={"m-flaky": 2, "m-down": 99}))
    healthy = make_consumer()

    def work(consumer) -> str:
        stats = Worker(db.conninfo, consumer, policy=settings.retry_policy(QUEUE), config=config, metrics=metrics).run(
            once=True
        )
        return ", ".join(f"{k}={v}" for k, v in stats.fields().items() if v)

    with db.connect(autocommit=True) as conn:
        queue = PgQueue(conn)

        def enqueue(payload, job_id=None) -> uuid.UUID:
            envelope = Envelope(
                job_id=job_id or uuid.uuid4(),
                payload=payload,
                tenant_id=TENANT,
                correlation_id=f"demo-{payload.get('member_id')}",
            )
            queue.publish(QUEUE, envelope)
            return envelope.job_id

        def say(line: str) -> None:
            out.write(f"  {line}\n")

        def balances() -> str:
            rows = conn.execute(
                "SELECT member_id, points FROM example.loyalty_points WHERE tenant_id = %s ORDER BY member_id",
                (TENANT,),
            ).fetchall()
            return ", ".join(f"{m}={p}" for m, p in rows) or "(none)"

        def fast_forward() -> str:
            row = conn.execute(
                "SELECT payload->>'member_id', attempts, round(extract(epoch FROM run_at - last_failed_at))"
                " FROM core.queue_messages WHERE run_at > now() ORDER BY id"
            ).fetchall()
            conn.execute("UPDATE core.queue_messages SET run_at = now() WHERE run_at > now()")
            return "; ".join(f"{m}: attempt {a} failed, retry scheduled {int(s)} s later" for m, a, s in row)

        ana = enqueue({"member_id": "m-ana", "points": 50})
        enqueue({"member_id": "m-ben", "points": 20})
        enqueue({"member_id": "m-ana", "points": 50}, job_id=ana)  # the broker delivers ana's job twice
        say("1. enqueued credits for m-ana (50) and m-ben (20), and m-ana's job a second time (same job_id)")
        say(f"   worker: {work(healthy)}; balances: {balances()} (the duplicate credited nothing)")

        enqueue({"member_id": "m-eve", "points": -5})
        say("2. enqueued a poison payload (points -5)")
        say(f"   worker: {work(healthy)} at once, zero retries")

        enqueue({"member_id": "m-flaky", "points": 10})
        enqueue({"member_id": "m-down", "points": 15})
        say("3. enqueued credits for m-flaky (ledger times out twice) and m-down (ledger stays down)")
        for _ in range(4):
            say(f"   worker: {work(outage)}")
            say(f"   fast-forward: {fast_forward()}")
        say(f"   worker: {work(outage)}; balances: {balances()}")

        letters = conn.execute(
            "SELECT id, payload->>'member_id', attempts, last_error FROM core.dead_letters"
            " WHERE queue = %s AND correlation_id LIKE 'demo-%%' ORDER BY id",
            (QUEUE,),
        ).fetchall()
        for letter_id, member, attempts, error in letters:
            say(f"   dead letter {letter_id}: {member}, {attempts} attempt(s), {error}")
        by_member = {member: letter_id for letter_id, member, _a, _e in letters}

        replay(conn, [by_member["m-down"]], operator=OPERATOR, reason="loyalty ledger outage over")
        say(f"4. operator replays dead letter {by_member['m-down']} (same job_id); the ledger is back")
        say(f"   worker: {work(healthy)}; balances: {balances()}")
        discard(conn, [by_member["m-eve"]], operator=OPERATOR, reason="negative points: fixed at the source, OPS-2001")
        say(f"5. operator discards dead letter {by_member['m-eve']} with a reason")
        for action, letter_id, who, reason in conn.execute(
            "SELECT action, dead_letter_id, operator, reason FROM core.dead_letter_actions WHERE operator = %s"
            " ORDER BY id",
            (OPERATOR,),
        ):
            say(f"   audit ledger: {who} {action} {letter_id}: {reason}")
        row = conn.execute("SELECT count(*) FROM core.queue_messages").fetchone()
        assert row is not None
        left = row[0]
        say(
            f"   messages left in the queue: {left}; metrics: "
            + ", ".join(
                f"{name}={metrics.value(name, consumer=QUEUE):g}" for name in ("processed", "duplicates", "retries")
            )
            + ", dead_lettered="
            + ", ".join(
                f"{reason}:{metrics.value('dead_lettered', consumer=QUEUE, reason=reason):g}"
                for reason in ("poison", "exhausted")
            )
        )
