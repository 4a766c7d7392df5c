"""Deprecated: ``maintenance.jobs.alerts.config`` moved to ``alerts.config``; this shim goes in the next minor version."""

from maintenance.runtime.imports import moved_module

moved_module(__name__, "alerts.config")
