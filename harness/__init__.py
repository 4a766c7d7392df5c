"""The consumer harness: the idempotency fence in the work transaction, retries, poison, dead letters.

Imports nothing else of core-jobs. Start with ``harness.consumer`` (declaring a consumer) and
``harness.handling`` (what happens to one delivery); ``harness.pgqueue`` is the reference queue
and ``harness.worker`` the loop behind ``core-jobs worker``. docs/harness.md.
"""
