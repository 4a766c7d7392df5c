"""Deprecated: ``maintenance.jobs.alerts.settings`` moved to ``alerts.settings``; this shim goes in the next minor version."""

from maintenance.runtime.imports import moved_module

moved_module(__name__, "alerts.settings")
