"""Better Stack Uptime: the incidents client the alerts job posts through, and the heartbeat every run pings.

- ``client.py`` — :class:`~maintenance.integrations.betterstack.client.BetterStackClient`:
  create, find and resolve incidents, rate-limited, with bounded retries and no duplicate or
  foreign incidents (its docstring is the manual); used by ``maintenance/jobs/alerts/``.
- ``heartbeat.py`` — the dead-man's switch pinged after ``core-jobs run-once`` and after each
  run under ``core-jobs serve`` (``CORE_JOBS_BETTERSTACK_HEARTBEAT_URL``).

Both keep their secrets (the API token, the heartbeat URL's path) out of logs and errors.
"""
