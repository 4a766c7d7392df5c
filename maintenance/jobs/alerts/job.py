"""Deprecated: ``maintenance.jobs.alerts.job`` moved to ``alerts.feed``; this shim goes in the next minor version."""

from maintenance.runtime.imports import moved_module

moved_module(__name__, "alerts.feed")
