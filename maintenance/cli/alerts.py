"""Deprecated: ``maintenance.cli.alerts`` moved to ``alerts.cli``; this shim goes in the next minor version."""

from maintenance.runtime.imports import moved_module

moved_module(__name__, "alerts.cli")
