"""The ``alerts`` job: the dead-letter alert feed (``alerts/feed.py``) wired to the settings.

``core-jobs run-once alerts`` posts Better Stack incidents for new dead letters, escalates stale
ones and resolves handled ones — and the same for durable executions left
RECONCILIATION_REQUIRED (one incident per consumer, issue 12); without ``CORE_JOBS_BETTERSTACK_API_TOKEN`` it runs dry. The
feed's module docstring is the operator's manual; this module only maps ``CORE_JOBS_*``
settings onto :class:`AlertFeedConfig` and the Better Stack client, and registers the job.
"""
