"""Deprecated: ``alerts.execution_sql`` is folded into ``alerts.sql``; this shim goes in the next minor version."""

from maintenance.runtime.imports import moved_module

moved_module(__name__, "alerts.sql")
