"""The fence's statement and the health check of its transaction, shared by plain and durable consumers.

:data:`INSERT_FENCE` is the first write of the work transaction (J-B1; harness/handling.py for a
plain consumer, the final transaction of harness/durable/executor.py for a durable one), and
:func:`check_work_transaction` is what must hold before that transaction commits.
"""

from __future__ import annotations

import psycopg
from psycopg.pq import TransactionStatus

from harness.errors import PermanentError, TransientError

__all__ = ["INSERT_FENCE", "check_work_transaction"]

# The fence (J-B1): inserted first in the work transaction; RETURNING 1 tells new from duplicate.
INSERT_FENCE = """
INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, expires_at)
VALUES (%(job_id)s, %(consumer)s, %(tenant_id)s, now() + %(ttl)s)
ON CONFLICT DO NOTHING
RETURNING 1
"""


def check_work_transaction(conn: psycopg.Connection) -> None:
    """Refuse to commit unless the handler left the fence's transaction open and healthy.

    A swallowed database error leaves it aborted: psycopg's COMMIT would then silently roll
    back, and the job would be acked with nothing done. A COMMIT or ROLLBACK run by the handler
    ends it early: writes after that escape the fence, so a retry could apply them twice.
    """
    status = conn.info.transaction_status
    if status == TransactionStatus.INERROR:
        raise TransientError(
            "the handler caught a database error and carried on: its transaction was aborted, so nothing was committed"
        )
    if status == TransactionStatus.IDLE:
        raise PermanentError(
            "the handler ended the work transaction itself (COMMIT or ROLLBACK): its writes"
            " escaped the fence, so the job is not retried; fix the handler, then review the job"
        )
