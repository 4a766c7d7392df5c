"""Deprecated: ``maintenance.integrations.betterstack.client`` moved to ``alerts.betterstack``; this shim goes in the next minor version."""

from maintenance.runtime.imports import moved_module

moved_module(__name__, "alerts.betterstack")
