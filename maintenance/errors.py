"""ConfigError: a configuration problem, exit code 2 — importable without loading the settings."""

from __future__ import annotations


class ConfigError(Exception):
    """A configuration problem; the message names the setting. The CLI exits 2 on it."""
