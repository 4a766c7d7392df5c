"""Deprecated: ``maintenance.jobs.alerts.groups`` moved to ``alerts.groups``; this shim goes in the next minor version."""

from maintenance.runtime.imports import moved_module

moved_module(__name__, "alerts.groups")
