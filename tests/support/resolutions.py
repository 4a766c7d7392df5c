"""What a resolution is made of in the tests that post one: an execution's checkpoints up to an uncertain
notify, the evidence, a CLOSE_WITHOUT_TRANSITION body (tests/maintenance/api/test_resolution.py, tests/harness/durable/test_commits.py)."""

from __future__ import annotations

UNCERTAIN_NOTIFY = (
    ("lookup", "READ_ONLY", "SUCCEEDED", {"member_id": "m-1"}),
    ("credit", "IDEMPOTENT_WRITE", "SUCCEEDED", {"receipt_id": "r-1", "points": 10}),
    ("notify", "NON_IDEMPOTENT_WRITE", "UNCERTAIN", None),
)
EVIDENCE = {"reference": "CASE-2026-1201", "reason": "the provider's console shows message msg-9 sent at 08:02"}


def close(kind: str) -> dict:
    return {"command": "CLOSE_WITHOUT_TRANSITION", "evidence": {**EVIDENCE, "kind": kind}}
