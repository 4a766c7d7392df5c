"""The scheduled jobs: one package each, with the same parts.

- ``__init__.py`` — the package docstring: why the job exists and works as it does, and a pointer
  to its operator's manual, docs/<job>.md (written once, there); imports nothing.
- ``settings.py`` — the job's settings, declared once (default, bounds, unit, description): a
  pydantic mixin that *is* the job's configuration, validated whether read from the environment
  or built in code (``PurgeFields(purge_batch_size=10)``).
- ``sql.py`` — the SQL that matters, each statement under a name with what it does.
- ``job.py`` — the job, built as ``Job(settings, env)`` (``env``: the :class:`~maintenance.jobs.base.JobEnv`
  every job shares), ``run_once(now) -> Result`` (the result names its event fields) and ``SPEC``
  (name, summary, settings mixin, ``build``).

The ordered tuple of jobs is :data:`maintenance.jobs.catalog.JOBS`.
"""
