"""Settings of ``core-jobs api`` (``CORE_JOBS_API_*``), a topic mixin of :class:`maintenance.settings.Settings`.

Every field has a documented default; none is needed by the other commands, so a missing
issuer or key source is reported only when the API starts (:meth:`ApiSettings.api_problems`,
exit 2). Their rows are in docs/reference/settings.md; docs/api.md explains them.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated

from pydantic import BaseModel, Field, ValidationInfo, field_validator
from pydantic_settings import NoDecode

from maintenance.fields import CONSUMER_REFERENCE, listed
from maintenance.fields.durations import NonNegativeDuration as _Duration
from maintenance.fields.durations import PositiveDuration as _PositiveDuration
from maintenance.fields.durations import PostgresTimeout
from maintenance.fields.urls import check_http_url

ASYMMETRIC_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")

_ADMIN_ENTRY_SHAPES = {
    "admin_consumers": (
        CONSUMER_REFERENCE,
        "module:attribute, e.g. harness.examples.points:consumer",
    ),
    "admin_business_scopes": (re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]*$"), "a name of letters, digits and . _ : -"),
}

DEFAULT_API_PORT = 8080
DEFAULT_API_JWT_ALGORITHMS = ["RS256", "ES256"]
DEFAULT_API_JWT_LEEWAY = timedelta(seconds=30)  # clock skew on exp/nbf/iat
DEFAULT_API_JWKS_CACHE_LIFESPAN = timedelta(minutes=5)  # keys reused this long
DEFAULT_API_JWKS_REFETCH_INTERVAL = timedelta(seconds=10)  # unknown kid: at most one fetch per interval
DEFAULT_API_DATABASE_ROLE = "core_jobs_api"  # migration 0009
DEFAULT_API_POOL_MAX_SIZE = 8  # connections
DEFAULT_API_WORKER_THREADS = 4  # api_worker_threads: see its description
DEFAULT_API_MAX_BODY_BYTES = 256 * 1024  # bytes
DEFAULT_API_SHUTDOWN_GRACE = timedelta(seconds=20)  # in-flight requests on SIGTERM
DEFAULT_API_READ_TIMEOUT = timedelta(seconds=10)  # to send one request whole
DEFAULT_API_PROCESSES = 1  # api_processes: see its description


class ApiSettings(BaseModel):
    """The operations API's settings."""

    api_host: str = Field(default="0.0.0.0", description="`core-jobs api`: listen address (--host overrides).")
    api_port: int = Field(
        default=DEFAULT_API_PORT,
        ge=0,
        le=65535,
        description="`core-jobs api`: listen port, 0 for any free one (--port overrides).",
    )
    api_jwks_url: str | None = Field(
        default=None,
        description="JWKS URL of the token issuer (http:// or https://, no user:password@: refused). Keys are cached and fetched again when a "
        "token names an unknown kid. One of API_JWKS_URL and API_JWT_PUBLIC_KEY_FILE is required.",
    )
    api_jwt_public_key_file: str | None = Field(
        default=None, description="PEM file with the issuer's public key (RSA or EC), instead of a JWKS URL."
    )
    api_jwt_issuer: str | None = Field(default=None, description="Required `iss` of every token.")
    api_jwt_audience: str | None = Field(default=None, description="Required `aud` of every token (this API).")
    api_jwt_algorithms: Annotated[list[str], NoDecode] = Field(
        default=DEFAULT_API_JWT_ALGORITHMS,
        description="Accepted signature algorithms, asymmetric only (none and HS* are refused). JSON list or "
        "comma-separated.",
    )
    api_jwt_leeway: _Duration = Field(
        default=DEFAULT_API_JWT_LEEWAY, description="Clock skew allowed on exp, nbf and iat (at most PT5M)."
    )
    api_jwks_cache_lifespan: _PositiveDuration = Field(
        default=DEFAULT_API_JWKS_CACHE_LIFESPAN,
        description="How long fetched JWKS keys are used before they are fetched again.",
    )
    api_jwks_refetch_interval: _Duration = Field(
        default=DEFAULT_API_JWKS_REFETCH_INTERVAL,
        description="An unknown kid fetches the JWKS again at most this often (a stream of forged kids cannot "
        "flood the issuer).",
    )
    api_jwks_timeout: _PositiveDuration = Field(default=timedelta(seconds=5), description="Timeout of one JWKS fetch.")
    api_database_role: str | None = Field(
        default=DEFAULT_API_DATABASE_ROLE,
        description="Role every API connection switches to (SET ROLE): the least-privilege role created by the "
        "migrations. The login must be a member of it. Empty: no SET ROLE (not recommended).",
    )
    api_pool_min_size: int = Field(default=1, ge=0, le=100, description="Database connections the API keeps open.")
    api_pool_max_size: int = Field(
        default=DEFAULT_API_POOL_MAX_SIZE, ge=1, le=100, description="Most database connections the API opens."
    )
    api_worker_threads: int = Field(
        default=DEFAULT_API_WORKER_THREADS,
        ge=1,
        le=100,
        description="Requests the API works on at once in its worker threads (an endpoint and its database "
        "calls); the others wait their turn in arrival order. The API's Python runs on one core at a time, so "
        "more threads only queue for it: under 8 concurrent operators on 2 cores, the web framework's 40 gave "
        "resolutions a p95 of 51 ms, 4 gave 42 ms (docs/performance.md). A request waiting on the database "
        "holds its thread: raise it for many concurrent slow requests (bulk replays), within "
        "CORE_JOBS_API_POOL_MAX_SIZE. The probes, /metrics and token verification never wait for these threads.",
    )
    api_processes: int = Field(
        default=DEFAULT_API_PROCESSES,
        ge=1,
        le=64,
        description="API processes serving one listening socket (a pre-fork; Linux): the API's Python runs on one "
        "core at a time, so more processes let it use more cores. Each has its own database pool "
        "(API_POOL_MAX_SIZE each), worker threads and token cache; /metrics adds up all of them. Keep 1 where the "
        "API shares its cores with PostgreSQL or other busy processes, or scale with replicas instead; raise it to "
        "the cores the pod may use when the API itself is the bottleneck (docs/performance.md, docs/api.md).",
    )
    api_pool_timeout: _PositiveDuration = Field(
        default=timedelta(seconds=5),
        description="How long a request waits for a free database connection before it gets 503.",
    )
    api_statement_timeout: PostgresTimeout = Field(
        default=timedelta(seconds=10), description="statement_timeout of the API's database sessions."
    )
    api_max_body_bytes: int = Field(
        default=DEFAULT_API_MAX_BODY_BYTES,
        ge=1024,
        le=16 * 1024 * 1024,
        description="Largest request body; a larger one gets 413 before it is parsed (1 000 ids fit in ~20 kB).",
    )
    api_read_timeout: _PositiveDuration = Field(
        default=DEFAULT_API_READ_TIMEOUT,
        description="How long a client may take to send one request whole (request line, headers, body, trailers), "
        "from the connection's opening or the request's first byte; past it 408 and the connection is closed. "
        "Raise it with API_MAX_BODY_BYTES for slow clients.",
    )
    api_shutdown_grace: _PositiveDuration = Field(
        default=DEFAULT_API_SHUTDOWN_GRACE,
        description="On SIGTERM: how long in-flight requests may take to finish before the server closes them "
        "(keep below the pod's terminationGracePeriodSeconds).",
    )

    @field_validator("api_jwt_algorithms", "admin_consumers", "admin_business_scopes", mode="before")
    @classmethod
    def _list(cls, value: object) -> object:
        return listed(value)

    @field_validator("admin_consumers", "admin_business_scopes")
    @classmethod
    def _admin_entries(cls, value: list[str], info: ValidationInfo) -> list[str]:
        shape, expected = _ADMIN_ENTRY_SHAPES[info.field_name or ""]
        malformed = [v for v in value if not shape.match(v)]
        if malformed:
            raise ValueError(f"each entry is {expected}; got {malformed}")
        return value

    @field_validator("api_jwt_algorithms")
    @classmethod
    def _asymmetric_only(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("needs at least one algorithm")
        refused = [a for a in value if a not in ASYMMETRIC_ALGORITHMS]
        if refused:
            raise ValueError(
                f"only asymmetric algorithms ({', '.join(ASYMMETRIC_ALGORITHMS)}); refused: {', '.join(refused)}"
            )
        return value

    @field_validator("api_jwt_leeway")
    @classmethod
    def _small_leeway(cls, value: timedelta) -> timedelta:
        if value > timedelta(minutes=5):
            raise ValueError("at most PT5M: a larger leeway keeps expired tokens valid")
        return value

    @field_validator("api_jwks_url")
    @classmethod
    def _jwks_url(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        # No user:password@ (check-config shows the URL, and a key set needs no secret); never quoted back.
        check_http_url(value, credentials_hint="; serve the key set without one")
        return value.strip()

    admin_enabled: bool = Field(
        default=False,
        description="Serve `POST /v1/core/executions/{id}/resolve` (operator resolution of RECONCILIATION_REQUIRED "
        "executions). Off: the route does not exist (404). On: the API refuses to start unless its database session "
        "is the restricted API role, and needs ADMIN_CONSUMERS and ADMIN_BUSINESS_SCOPES.",
    )
    admin_consumers: Annotated[list[str], NoDecode] = Field(
        default=[],
        description="The published definitions a resolution is checked against: durable consumers as module:attribute "
        "(JSON list or comma-separated), imported at start. An execution of any other consumer cannot be resolved "
        "here (409).",
    )
    admin_business_scopes: Annotated[list[str], NoDecode] = Field(
        default=[],
        description="The business scopes this deployment resolves executions of (JSON list or comma-separated); a "
        "token's business_scopes claim must name the execution's scope too.",
    )

    @field_validator("api_jwt_public_key_file", "api_jwt_issuer", "api_jwt_audience", "api_database_role")
    @classmethod
    def _blank_is_none(cls, value: str | None) -> str | None:
        return None if value is None or not value.strip() else value.strip()

    def api_problems(self) -> list[str]:
        """What keeps the API from starting (empty when nothing does), one problem per entry."""
        problems = []
        if (self.api_jwks_url is None) == (self.api_jwt_public_key_file is None):
            problems.append("set exactly one of CORE_JOBS_API_JWKS_URL and CORE_JOBS_API_JWT_PUBLIC_KEY_FILE")
        if self.api_jwt_issuer is None:
            problems.append("CORE_JOBS_API_JWT_ISSUER is required: tokens of any other issuer are refused")
        if self.api_jwt_audience is None:
            problems.append("CORE_JOBS_API_JWT_AUDIENCE is required: tokens meant for another service are refused")
        if self.api_pool_min_size > self.api_pool_max_size:
            problems.append("CORE_JOBS_API_POOL_MIN_SIZE must not exceed CORE_JOBS_API_POOL_MAX_SIZE")
        if self.admin_enabled and not self.admin_consumers:
            problems.append("CORE_JOBS_ADMIN_ENABLED needs CORE_JOBS_ADMIN_CONSUMERS: the published definitions")
        if self.admin_enabled and not self.admin_business_scopes:
            problems.append("CORE_JOBS_ADMIN_ENABLED needs CORE_JOBS_ADMIN_BUSINESS_SCOPES: the scopes it serves")
        return problems
