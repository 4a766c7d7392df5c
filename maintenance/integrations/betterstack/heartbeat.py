"""Deprecated: ``maintenance.integrations.betterstack.heartbeat`` moved to ``alerts.heartbeat``; this shim goes in the next minor version."""

from maintenance.runtime.imports import moved_module

moved_module(__name__, "alerts.heartbeat")
