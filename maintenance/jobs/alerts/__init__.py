"""Deprecated: the alerting jobs moved to the top-level package ``alerts`` (docs/alerts.md); each module here is a
shim that warns and hands back its new home, and goes in the next minor version."""
