"""Deprecated: ``maintenance.jobs.alerts.sources`` moved to ``alerts.sources``; this shim goes in the next minor version."""

from maintenance.runtime.imports import moved_module

moved_module(__name__, "alerts.sources")
