"""The operations HTTP API for dead letters and executions: ``core-jobs api``.

docs/api.md is the operator's manual; :mod:`maintenance.api.app` assembles the app. This package is imported by the
settings (``maintenance.settings.api``), so it imports nothing heavy itself.
"""
