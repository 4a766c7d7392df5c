"""Idempotent actions: the ``Idempotency-Key`` ledger in ``core.api_idempotency_keys``.

Every POST accepts an ``Idempotency-Key`` header (1–255 visible ASCII characters; a client
sends a new random one per intended action and the same one when it retries). With a key, the
action runs in one transaction that also records, under that key, the operator (the token's
``sub``), a fingerprint of the request — method, route, path parameters and the body in
canonical form (validated, keys sorted) — and the response: status and body.

- The same key from the same operator for the same request returns the recorded response —
  status and body, with ``Idempotent-Replayed: true`` — whatever happened since (the dead letter
  replayed, discarded, by this request or another). Nothing runs again.
- The same key with another request, or from another operator, is ``409
  idempotency-key-reused``; nothing runs.
- Two requests with one key at once take turns on a transaction-scoped advisory lock on the
  key: the second waits for the first to commit, then answers from the ledger.
- What is recorded is the answer of the action itself: success, and the problems the action
  raises as its own answer (``Problem(..., recorded=True)``: for the dead letters ``404
  dead-letter-not-found`` and ``409 not-pending-review``; a refused action is rolled back to a
  savepoint, its answer is still recorded). Answers that come before the action — 400, 401, 403, 413, 422 — are not
  recorded (the request can be fixed and sent again with the same key), nor is a failure of the
  database (nothing was committed; retry with the same key).

Keys are kept for ``CORE_JOBS_IDEMPOTENCY_KEY_RETENTION`` (P30D by default, at least P1D, so
that every retry of an action finds its key); then the purge deletes them
(``maintenance/jobs/purge``, ``DELETE_EXPIRED_IDEMPOTENCY_KEYS``; the API role cannot). A key
must not be reused for a new action meanwhile. Resolution keys are in the append-only
``core.execution_resolutions`` and never expire.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.types.json import Json

from maintenance.api.problems import Problem

KEY_SHAPE = re.compile(r"^[\x21-\x7e]{1,255}$")
LOCK_NAMESPACE = "core_jobs.api.idempotency"

# One request per key at a time (two int4 keys: a namespace of their own, apart from the jobs' locks).
LOCK_KEY = "SELECT pg_advisory_xact_lock(hashtext(%(namespace)s), hashtext(%(key)s))"
LOOKUP = """
SELECT operator, request_fingerprint, response_status, response_body
  FROM core.api_idempotency_keys
 WHERE idempotency_key = %(key)s
"""
RECORD = """
INSERT INTO core.api_idempotency_keys
       (idempotency_key, operator, method, route, request_fingerprint, response_status, response_body)
VALUES (%(key)s, %(operator)s, %(method)s, %(route)s, %(fingerprint)s, %(status)s, %(body)s)
"""


@dataclass(frozen=True)
class Outcome:
    status: int
    body: dict[str, Any]
    replayed: bool = False  # answered from the ledger


def check_key(key: str | None) -> str | None:
    """The header's value, or a 400 problem when it is not 1–255 visible ASCII characters."""
    if key is None:
        return None
    if not KEY_SHAPE.match(key):
        raise Problem(400, "malformed-request", "Idempotency-Key must be 1-255 visible ASCII characters (no spaces)")
    return key


def fingerprint(method: str, route: str, path_params: dict[str, Any], body: Any) -> str:
    """sha256 of the request in canonical form: the same request always gives the same value."""
    canonical = json.dumps(
        {"method": method, "route": route, "path": path_params, "body": body},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        default=str,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def run(
    conn: psycopg.Connection,
    *,
    key: str | None,
    operator: str,
    method: str,
    route: str,
    request_fingerprint: str,
    action: Callable[[psycopg.Connection], tuple[int, dict[str, Any]]],
) -> Outcome:
    """Run ``action`` once per key: in one transaction with its ledger row, or answer from the ledger."""
    with conn.transaction():
        if key is None:
            status, body = action(conn)
            return Outcome(status, body)
        conn.execute(LOCK_KEY, {"namespace": LOCK_NAMESPACE, "key": key})
        found = conn.execute(LOOKUP, {"key": key}).fetchone()
        if found is not None:
            recorded_operator, recorded_fingerprint, status, body = found
            if recorded_operator != operator or recorded_fingerprint != request_fingerprint:
                raise Problem(
                    409,
                    "idempotency-key-reused",
                    "this Idempotency-Key was used for another request or by another operator; "
                    "send a new key for a new action",
                )
            return Outcome(status, body, replayed=True)
        try:
            with conn.transaction():  # a savepoint: a refused action leaves nothing behind but its answer
                status, body = action(conn)
        except Problem as problem:
            if not problem.recorded:  # the action's own answer is recorded like a success; nothing else is
                raise
            status, body = problem.status, problem.body()
        conn.execute(
            RECORD,
            {
                "key": key,
                "operator": operator,
                "method": method,
                "route": route,
                "fingerprint": request_fingerprint,
                "status": status,
                "body": Json(body),
            },
        )
        return Outcome(status, body)
