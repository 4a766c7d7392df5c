"""Deprecated: ``maintenance.jobs.alerts.identity`` moved to ``alerts.identity``; this shim goes in the next minor version."""

from maintenance.runtime.imports import moved_module

moved_module(__name__, "alerts.identity")
