"""The operations HTTP API's application: dead letters (J-API1..3) and executions over HTTP, for operators.

Why a thin layer: Ops (never tenants) list, inspect, replay, discard and resolve over HTTP with the
same operations layer as the CLI (:mod:`maintenance.operations.dead_letters`), so both follow the
same rules and write the same audit ledger. This module assembles the app: one router per
resource (:mod:`maintenance.api.resources`), the problem+json mapping of every error
(:mod:`maintenance.api.problems`), the :class:`Guard` that checks every body before any route
(:mod:`maintenance.api.bodies`), the probes and the app's own metrics registry.

The operator's manual — every endpoint with its permission, authentication, idempotency, the
errors, admin mode, the database role, the metrics and logs, the settings — is docs/api.md,
written once there.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, values
from prometheus_client.exposition import choose_encoder
from prometheus_client.multiprocess import MultiProcessCollector
from psycopg_pool import ConnectionPool, PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from harness.errors import describe_error
from maintenance.api import bodies
from maintenance.api.admin import AdminConfig
from maintenance.api.auth import TokenVerifier
from maintenance.api.problems import PROBLEM_MEDIA_TYPE, Problem, ProblemModel
from maintenance.api.resources import dead_letters, executions, resolutions
from maintenance.api.threads import PROBING, run_on, use_endpoint_threads
from maintenance.runtime.logs import get_logger
from maintenance.settings.api import DEFAULT_API_WORKER_THREADS
from maintenance.settings.worker import DEFAULT_DEAD_LETTERS_BULK_MAX

QUIET_ROUTES = frozenset({"/healthz", "/readyz", "/metrics"})
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ApiMetrics:
    """The API's own Prometheus metrics, on a registry it owns (never prometheus_client's global one).

    ``multiprocess_directory``: the API serves in several processes (:mod:`maintenance.api.processes`), these
    metrics are created inside its ``shared_metrics()`` and ``/metrics`` shows :attr:`exposed`, every process's
    files there added up, instead of this process's own registry.
    """

    def __init__(self, registry: CollectorRegistry | None = None, *, multiprocess_directory: str | None = None) -> None:
        if multiprocess_directory is not None and not values.ValueClass._multiprocess:
            raise ValueError("ApiMetrics(multiprocess_directory=...) is created inside processes.shared_metrics()")
        self.registry = registry if registry is not None else CollectorRegistry()
        self.exposed = self.registry  # what /metrics encodes
        if multiprocess_directory is not None:
            self.exposed = CollectorRegistry()
            MultiProcessCollector(self.exposed, path=multiprocess_directory)
        labels = ("method", "route", "status")
        self.requests = Counter(
            "core_jobs_api_requests_total",
            "HTTP requests answered by the operations API.",
            labels,
            registry=self.registry,
        )
        self.latency = Histogram(
            "core_jobs_api_request_duration_seconds",
            "Time from request to the end of the response, by route and status.",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )

        self.resolutions = Counter(
            "core_jobs_api_execution_resolutions_total",
            "Resolutions of RECONCILIATION_REQUIRED executions applied by this API server (all its processes), by command "
            "(replays not counted).",
            ("command",),
            registry=self.registry,
        )
        self.processes = Gauge(
            "core_jobs_api_processes",
            "API processes serving (CORE_JOBS_API_PROCESSES): each counts itself while it lives, the processes of "
            "one server added up.",
            registry=self.registry,
            multiprocess_mode="livesum",  # a replaced child's 1 leaves with it
        )

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        self.requests.labels(method, route, str(status)).inc()
        self.latency.labels(method, route, str(status)).observe(seconds)


class _BodyTooLarge(Exception):
    pass


BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class Guard:
    """Outermost ASGI middleware: body size limit (413), storable JSON (422, :mod:`maintenance.api.bodies`),
    catch-all 500, metrics and the request log."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int, metrics: ApiMetrics) -> None:
        self.app, self.max_body_bytes, self.metrics = app, max_body_bytes, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        state: dict[str, Any] = {"status": 500, "started": False, "too_large": False}

        async def sending(message: Message) -> None:
            if state["too_large"]:  # whatever the app answers to a cut-off body, the answer is 413
                return
            if message["type"] == "http.response.start":
                state["status"], state["started"] = message["status"], True
            await send(message)

        async def answer(problem: Problem) -> None:
            state["too_large"] = False
            await problem.response()(scope, receive, sending)

        headers = dict(scope.get("headers") or {})
        declared = headers.get(b"content-length")
        try:
            if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
                raise _BodyTooLarge
            seen = 0

            async def receiving() -> Message:
                nonlocal seen
                message = await receive()
                if message["type"] == "http.request":
                    seen += len(message.get("body", b""))
                    if seen > self.max_body_bytes:
                        state["too_large"] = True
                        raise _BodyTooLarge
                return message

            app_receive: Receive = receiving
            if scope["method"] in BODY_METHODS and bodies.is_json(headers.get(b"content-type")):
                body = await _read_all(receiving)  # bounded: receiving raises past the limit
                problems = bodies.body_problems(body)
                if problems:
                    await answer(_unstorable(problems))
                    return
                app_receive = _replaying(body, receiving)
            await self.app(scope, app_receive, sending)
            if state["too_large"]:
                raise _BodyTooLarge
        except _BodyTooLarge:
            if not state["started"]:
                await answer(Problem(413, "payload-too-large", f"the request body exceeds {self.max_body_bytes} bytes"))
        except Exception as exc:  # a bug: answer 500 without details, log what happened
            get_logger().error(
                "maintenance.api.internal_error",
                method=scope["method"],
                path=scope["path"],
                error=describe_error(exc),
            )
            if not state["started"]:
                await answer(Problem(500, "internal-error", "the request failed; the API's log says why"))
        finally:
            route = scope.get("route")
            template = getattr(route, "path_format", None) or "unmatched"  # {id}, not {id:int}
            seconds = time.perf_counter() - started
            self.metrics.observe(scope["method"], template, state["status"], seconds)
            method, status, ms = scope["method"], state["status"], round(seconds * 1000, 2)
            subject = scope.get("state", {}).get("subject")
            if template in QUIET_ROUTES:  # probes and scrapes every few seconds: not at info
                get_logger().debug(
                    "maintenance.api.request",
                    method=method,
                    route=template,
                    status=status,
                    duration_ms=ms,
                    subject=subject,
                )
            else:
                get_logger().info(
                    "maintenance.api.request",
                    method=method,
                    route=template,
                    status=status,
                    duration_ms=ms,
                    subject=subject,
                )


async def _read_all(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the client went away: what came is all there is
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replaying(body: bytes, receive: Receive) -> Receive:
    """A receive that gives the app the body already read, whole, then what the client sends next (disconnect)."""
    given = False

    async def replay() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _unstorable(problems: list[tuple[list[str], str]]) -> Problem:
    described = [f"{'.'.join(location)}: {message}" for location, message in problems]
    return Problem(
        422,
        "invalid-request",
        "; ".join(described)[:1000],
        errors=[{"location": location, "message": message} for location, message in problems],
    )


def _validation_problem(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    malformed = any(e.get("type") == "json_invalid" or (e.get("loc") or ("body",))[0] != "body" for e in errors)
    described = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', 'invalid')}" for e in errors]
    summary = "; ".join(described)[:1000]
    if malformed:
        return Problem(400, "malformed-request", summary).response()
    return Problem(
        422,
        "invalid-request",
        summary,
        errors=[{"location": [str(p) for p in e.get("loc", ())], "message": e.get("msg", "")} for e in errors][:50],
    ).response()


def _http_problem(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    if exc.status_code == 404:
        return Problem(404, "not-found", f"no route {request.url.path}").response()
    if exc.status_code == 405:  # Starlette's exception carries the Allow header (RFC 9110)
        return Problem(
            405,
            "method-not-allowed",
            f"{request.method} is not allowed on {request.url.path}",
            headers=dict(exc.headers or {}),
        ).response()
    if exc.status_code == 415:
        return Problem(415, "unsupported-media-type", "send the body as application/json").response()
    return Problem(400, "malformed-request", str(exc.detail)).response()


def _database_problem(request: Request, exc: Exception) -> JSONResponse:
    get_logger().warning("maintenance.api.database_unavailable", error=describe_error(exc))
    return Problem(503, "database-unavailable", "the database cannot be reached or is busy; try again").response()


def create_app(
    *,
    pool: ConnectionPool,
    verifier: TokenVerifier,
    max_body_bytes: int = 256 * 1024,
    metrics: ApiMetrics | None = None,
    title: str = "core-jobs operations API",
    admin: AdminConfig | None = None,
    bulk_max: int = DEFAULT_DEAD_LETTERS_BULK_MAX,
    worker_threads: int = DEFAULT_API_WORKER_THREADS,
) -> FastAPI:
    """The API, its dependencies given explicitly: the pool is opened and closed by the app's lifespan.

    ``admin`` (admin mode) adds the resolution route; without it the route does not exist (404).
    ``worker_threads``: how many requests run their endpoint at once (CORE_JOBS_API_WORKER_THREADS).
    """
    from contextlib import asynccontextmanager

    metrics = metrics or ApiMetrics()

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        use_endpoint_threads(worker_threads)
        metrics.processes.set(1)  # this process serves: in its own file with several (maintenance/api/processes.py)
        pool.open(wait=False)  # start even when the database is down: /readyz says so
        try:
            yield
        finally:
            pool.close()

    app = FastAPI(
        title=title,
        version="1",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        lifespan=lifespan,
        # FastAPI's own OpenTelemetry spans: "<METHOD> <route>" (SERVER, a child of the request's
        # traceparent), with its dependencies and endpoint inside; the Guard's request log is in it.
        # Its OTel logs are off (an exception's text would bypass the log's secret masking) and so
        # are its metrics (the app's Prometheus registry counts requests); the SDK is ours to set
        # up (maintenance/runtime/tracing.py), never FastAPI's from the environment.
        telemetry={"tracing": True, "logs": False, "metrics": False, "auto_configure": False},
        description="List, inspect, replay and discard dead letters; list and inspect durable-action executions."
        " Errors are application/problem+json.",
    )
    app.state.pool, app.state.verifier, app.state.admin = pool, verifier, admin
    app.state.bulk_max = bulk_max  # CORE_JOBS_DEAD_LETTERS_BULK_MAX: a bulk action by filter touches at most this
    app.state.metrics = metrics

    app.add_exception_handler(Problem, lambda request, exc: exc.response())
    app.add_exception_handler(RequestValidationError, _validation_problem)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_problem)  # type: ignore[arg-type]
    app.add_exception_handler(PoolTimeout, _database_problem)
    app.add_exception_handler(psycopg.OperationalError, _database_problem)
    app.add_middleware(Guard, max_body_bytes=max_body_bytes, metrics=metrics)
    app.include_router(dead_letters.router)
    app.include_router(executions.router)  # read-only
    if admin is not None:
        app.include_router(resolutions.router)

    # The probes and /metrics never wait for an endpoint's worker thread (maintenance/api/threads.py): a
    # liveness probe that did would fail while every thread waits on the database, and the pod be restarted.
    @app.get("/healthz", tags=["probes"], summary="The process is up")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get(
        "/readyz",
        tags=["probes"],
        summary="The database answers",
        responses={
            503: {
                "description": "Database unavailable",
                "content": {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}},
            }
        },
    )
    async def readyz() -> dict[str, str]:
        def check() -> None:
            with pool.connection(timeout=2) as conn:
                conn.execute("SELECT 1")

        await run_on(PROBING, check)
        return {"status": "ready"}

    @app.get("/metrics", include_in_schema=False)
    async def prometheus(request: Request) -> Response:  # in memory (several processes: small local files): on the loop
        # prometheus-client's own negotiation: OpenMetrics to a scraper that asks for it, else the text format.
        encode, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encode(metrics.exposed), media_type=content_type)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            schema.setdefault("components", {}).setdefault("schemas", {})["Problem"] = ProblemModel.model_json_schema()
            schema["components"]["securitySchemes"] = {
                "bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}
            }
            for path, operations in schema["paths"].items():
                for operation in operations.values():
                    # FastAPI documents its own 422 where this API answers 400 (query and path errors).
                    if "HTTPValidationError" in str(operation["responses"].get("422", "")):
                        del operation["responses"]["422"]
                    if path.startswith("/v1/"):
                        operation["security"] = [{"bearer": []}]
            for unused in ("HTTPValidationError", "ValidationError"):
                if unused not in str(schema["paths"]):
                    schema["components"]["schemas"].pop(unused, None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.get("/openapi.json", include_in_schema=False)
    def openapi_document() -> JSONResponse:
        return JSONResponse(app.openapi())

    return app
