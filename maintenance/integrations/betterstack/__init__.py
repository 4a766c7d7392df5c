"""Deprecated: the Better Stack client and heartbeat moved to ``alerts.betterstack`` and ``alerts.heartbeat``; each
module here is a shim that warns and hands back its new home, and goes in the next minor version."""
