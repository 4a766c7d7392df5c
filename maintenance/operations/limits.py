"""The operations' caps that the settings default to, in a module that imports nothing.

``maintenance.settings`` names them as its defaults; importing them from
:mod:`maintenance.operations.dead_letters` instead would load psycopg into every command that
only reads its settings (``check-config``, ``--help`` of a command that loads them).
"""

from __future__ import annotations

DEFAULT_BULK_MAX = 1000  # dead letters one bulk action by filter may touch (CORE_JOBS_DEAD_LETTERS_BULK_MAX)
