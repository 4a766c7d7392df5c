"""Deprecated: ``alerts.groups`` is folded into ``alerts.incidents``; this shim goes in the next minor version."""

from maintenance.runtime.imports import moved_module

moved_module(__name__, "alerts.incidents")
