"""The operations HTTP API for dead letters (issue 11): ``core-jobs api``.

See :mod:`maintenance.api.app` for the operator's manual. This package is imported by the
settings (``maintenance.settings.api``), so it imports nothing heavy itself.
"""
