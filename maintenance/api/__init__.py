"""The operations HTTP API for dead letters and executions: ``core-jobs api``.

See :mod:`maintenance.api.app` for the operator's manual. This package is imported by the
settings (``maintenance.api.settings``), so it imports nothing heavy itself.
"""
