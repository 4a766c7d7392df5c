"""The scheduled jobs: one package each, with the same parts.

- ``__init__.py`` — the package docstring: why the job exists and works as it does, and a pointer
  to its operator's manual, docs/<job>.md (written once, there); imports nothing.
- ``settings.py`` — the job's settings, declared once (default, bounds, unit, description).
- ``config.py`` — the named defaults, with their units (the settings import them), and the
  config built from the settings in one place (``from_settings``).
- ``sql.py`` — the SQL that matters, each statement under a name with what it does.
- ``job.py`` — the job: a constructor that validates, ``run_once(now) -> Result`` (the result
  names its event fields), ``build`` (the scheduler entry) and ``SPEC`` (name, summary, default
  schedule).

The ordered tuple of jobs is :data:`maintenance.jobs.catalog.JOBS`.
"""
