"""What a consumer service declares: the consumer, its durable actions and their effect classes, retry policies.

``consumer`` (``Consumer``, ``JobContext``), ``actions`` (``Action``, ``ActionContext``, the
idempotency key of a write), ``effects`` (``Effect`` and ``RULES``: what the executor does for
each effect class) and ``retry`` (``RetryPolicy``, its delays and worst case, J-B7). The rest of
the harness reads these declarations and never the other way round (pyproject.toml's import
contracts); docs/harness.md.
"""
