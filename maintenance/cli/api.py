"""``core-jobs api``: the operations HTTP API (dead letters, executions, resolutions) until SIGTERM (docs/api.md).

Only this command loads FastAPI and uvicorn (maintenance/api/server.py).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from maintenance.settings import Settings


def cmd_api(args: argparse.Namespace, settings: Settings) -> int:
    from maintenance.api.server import serve as serve_api  # FastAPI and uvicorn: only for api

    return serve_api(settings, host=args.host, port=args.port)


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``api`` on the ``core-jobs`` parser."""
    p = sub.add_parser(
        "api", help="serve the operations HTTP API (dead letters, executions) until SIGTERM (docs/api.md)"
    )
    p.add_argument("--host", help="listen address (default CORE_JOBS_API_HOST)")
    p.add_argument("--port", type=int, help="listen port, 0 for any free one (default CORE_JOBS_API_PORT)")
    p.set_defaults(handler=cmd_api)
