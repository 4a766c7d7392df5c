"""Deprecated: ``maintenance.jobs.alerts.execution_sql`` moved to ``alerts.execution_sql``; this shim goes in the next minor version."""

from maintenance.runtime.imports import moved_module

moved_module(__name__, "alerts.execution_sql")
