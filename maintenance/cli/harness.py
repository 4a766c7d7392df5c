"""Deprecated: ``maintenance.cli.harness`` was split into one module per command group; this shim goes in the next
minor version.

``worker`` (``cmd_worker``, ``worker_consumers``, ``broker_failure``), ``enqueue`` (``cmd_enqueue``),
``dead_letters`` (the ``dead-letters`` commands), ``common`` (``consumer_references``, ``add_limit_option``,
``bounded_int``, ``one_line``); the exit codes and ``default_operator`` are :mod:`maintenance.errors`'. Importing it
warns; every name is the very same object as at its new home.
"""

import warnings

from maintenance.cli.common import add_limit_option, consumer_references
from maintenance.cli.common import bounded_int as _bounded_int
from maintenance.cli.common import one_line as _one_line
from maintenance.cli.dead_letters import (
    ANY_STATUS,
    DEFAULT_STATUS,
    STATUS_CHOICES,
    cmd_dead_letters_discard,
    cmd_dead_letters_errors,
    cmd_dead_letters_list,
    cmd_dead_letters_release,
    cmd_dead_letters_replay,
    cmd_dead_letters_show,
)
from maintenance.cli.enqueue import cmd_enqueue
from maintenance.cli.worker import broker_failure, cmd_worker, worker_consumers
from maintenance.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, default_operator

__all__ = [
    "ANY_STATUS",
    "DEFAULT_STATUS",
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "STATUS_CHOICES",
    "_bounded_int",
    "_one_line",
    "add_limit_option",
    "broker_failure",
    "cmd_dead_letters_discard",
    "cmd_dead_letters_errors",
    "cmd_dead_letters_list",
    "cmd_dead_letters_release",
    "cmd_dead_letters_replay",
    "cmd_dead_letters_show",
    "cmd_enqueue",
    "cmd_worker",
    "consumer_references",
    "default_operator",
    "worker_consumers",
]

warnings.warn(
    "maintenance.cli.harness is deprecated and goes in the next minor version: import maintenance.cli.worker,"
    " .enqueue, .dead_letters or .common (the exit codes: maintenance.errors)",
    DeprecationWarning,
    stacklevel=2,
)
