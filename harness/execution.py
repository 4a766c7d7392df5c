"""Running a durable consumer's job: executions, checkpoints, retries and reconciliation.

The contract is docs/durable-actions.md; this module implements it (issue 12).
"""
