"""ConfigError and the exit codes every command uses, written once — importable without loading the settings."""

from __future__ import annotations

import getpass

# Every command's exit status (docs/cli.md): done; failed (a job, the database, a refused action); a usage
# or configuration error (nothing was done).
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class ConfigError(Exception):
    """A configuration problem; the message names the setting. The CLI exits 2 on it."""


def default_operator() -> str:
    """Who acts, for an audit ledger, when a command is not told: the login's user name, else blank."""
    try:
        return getpass.getuser()
    except Exception:  # no $USER and no passwd entry (a bare container)
        return ""
