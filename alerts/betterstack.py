"""A small Better Stack Uptime API client (httpx): create, find and resolve incidents.

What it does on each request
----------------------------
- **Rate limit**, client side: at most ``max_requests_per_second`` requests (default 8, the pace
  the official Terraform provider keeps); a request that comes early waits for its slot.
- **Timeouts**: ``timeout`` seconds for connect, read and write (default 10).
- **Bounded retries** after a connection error, a timeout, ``429`` or a ``5xx``, waiting as the
  retry policy says (``harness.consumer.retry.compute_delay``: backoff 1 s doubling, cap 30 s, jitter
  ±20 %) or longer when the answer carries ``Retry-After`` (bounded by the policy's
  ``retry_after_cap``). Default: 3 retries, so 4 attempts.
- **Fail fast** on any other ``4xx``: :class:`BetterStackError` with the status and the start of
  the response body (Better Stack says what was wrong there).
- **No duplicate incidents**: a POST has no idempotency key at Better Stack, so a failure after
  which the incident may exist anyway (timeout, dropped connection, 5xx) is not blindly
  re-sent: :meth:`create_incident` first looks the incident up by its metadata key.
- **No foreign incidents**: a lookup takes an incident only when its metadata carries the key
  *and* every ``scope`` entry (the feed's installation id), checked here on each candidate.
- **The token** travels only in the ``Authorization`` header: never in a URL, an error, a log
  line or ``repr``. ``pagination.next`` links are followed only on the configured origin, so
  the token is never sent anywhere else.

- **Exactly the documented body**: a create carries only the body parameters of Better Stack's
  v3 create-incident documentation (:data:`CREATE_PARAMETERS`,
  https://betterstack.com/docs/uptime/api/create-a-new-incident/); any other field is refused
  here, before sending. Metadata goes out as typed values, ``{name: [{"type": "String",
  "value": "…"}]}``, the form Better Stack returns and filters on (``metadata[name][][value]``).

``sleep``, ``monotonic`` and ``random`` are injectable, so tests never wait in real time.

Events: ``alerts.betterstack.retry`` (``method``, ``path``, ``attempt``, ``reason``,
``delay_s``).
"""

from __future__ import annotations

import random as _random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx
import structlog

from harness.consumer.retry import RetryPolicy, compute_delay

if TYPE_CHECKING:
    from alerts.settings import AlertsFields

INCIDENTS_PATH = "/api/v3/incidents"
# The body parameters of POST /api/v3/incidents, as Better Stack's v3 documentation lists them
# (https://betterstack.com/docs/uptime/api/create-a-new-incident/). Not ``push``: the response
# shows it, the create parameters do not define it.
CREATE_PARAMETERS = frozenset(
    {
        "team_name",
        "requester_email",
        "name",
        "summary",
        "description",
        "call",
        "sms",
        "email",
        "critical_alert",
        "team_wait",
        "policy_id",
        "metadata",
    }
)
# Better Stack's maximum page size for listing incidents.
PAGE_SIZE = 50
# A metadata lookup matches a handful of incidents; more pages than this means a broken filter.
MAX_PAGES = 20
# How much of an error response body goes into the exception.
ERROR_BODY_CHARS = 500

DEFAULT_RETRY_POLICY = RetryPolicy(
    max_attempts=4,
    base_delay=timedelta(seconds=1),
    max_delay=timedelta(seconds=30),
    jitter=0.2,
    retry_after_cap=timedelta(seconds=120),
)

# Failures that prove the request never reached the server: safe to send again as is.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


class BetterStackError(Exception):
    """A request to Better Stack failed for good; ``status`` is the HTTP status when there was one."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class IncidentNotFound(BetterStackError):
    """Better Stack answered 404 for one incident: deleted there, or not visible to this token."""


@dataclass(frozen=True)
class Incident:
    """The parts of a Better Stack incident the feed needs."""

    id: str
    status: str | None
    metadata: Mapping[str, Any]
    # True when create_incident found it by its metadata after a failed POST instead of
    # confirming its own POST: it existed already (the earlier attempt got through).
    recovered: bool = False

    def metadata_values(self, key: str) -> list[str]:
        """Values of metadata ``key``, whether Better Stack sent ``["v"]``, ``[{"value": "v"}]`` or ``"v"``."""
        raw = self.metadata.get(key)
        items = raw if isinstance(raw, list) else [raw] if raw is not None else []
        return [str(i.get("value")) if isinstance(i, Mapping) else str(i) for i in items]

    def matches(self, key_name: str, key_value: str, scope: Mapping[str, str]) -> bool:
        """Its metadata has ``key_value`` under ``key_name`` and exactly ``[value]`` under each scope entry."""
        return key_value in self.metadata_values(key_name) and all(
            self.metadata_values(name) == [value] for name, value in scope.items()
        )


class BetterStackClient:
    """One Better Stack Uptime API account (one token, optionally one team)."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        team_name: str | None = None,
        timeout: float = 10.0,
        retry_policy: RetryPolicy = DEFAULT_RETRY_POLICY,
        max_requests_per_second: float = 8.0,
        sleep: Callable[[float], None] = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
        random: Callable[[], float] = _random.random,
        log: Any = None,
    ) -> None:
        if not token:
            raise ValueError("a Better Stack API token is required")
        if max_requests_per_second <= 0:
            raise ValueError(f"max_requests_per_second must be positive, got {max_requests_per_second}")
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        self.base_url = base_url.rstrip("/")
        self.team_name = team_name
        self.timeout = timeout
        self.retry_policy = retry_policy
        self._token = token
        self._interval = 1.0 / max_requests_per_second
        self._sleep = sleep
        self._monotonic = monotonic
        self._random = random
        self._log = log or structlog.get_logger()
        self._next_slot = float("-inf")
        self._http: httpx.Client | None = None

    def __repr__(self) -> str:
        return f"BetterStackClient(base_url={self.base_url!r}, team_name={self.team_name!r}, token='***')"

    # --- the API --------------------------------------------------------------------------------
    def create_incident(
        self, fields: Mapping[str, Any], *, key_name: str, key_value: str, scope: Mapping[str, str] | None = None
    ) -> Incident:
        """POST an incident whose metadata carries ``key_name: [key_value]`` and each ``scope``
        entry (``name: [value]``); return it once confirmed.

        ``fields`` holds documented create parameters only (:data:`CREATE_PARAMETERS`, else
        ValueError, nothing sent); its ``metadata`` maps names to lists of plain strings, sent
        typed like the key and the scope. Confirmed means ``201`` with a ``data.id``. Before re-sending after a failure that may
        have created it anyway, the incident is looked up by that metadata (key and scope) and
        returned if found, with ``recovered=True``.
        """
        undocumented = sorted(set(fields) - CREATE_PARAMETERS)
        if undocumented:
            raise ValueError(f"not a create-incident parameter of the Better Stack v3 API: {', '.join(undocumented)}")
        body = dict(fields)
        metadata = {name: [_typed(v) for v in values] for name, values in (body.get("metadata") or {}).items()}
        metadata[key_name] = [_typed(key_value)]
        for name, value in (scope or {}).items():
            metadata[name] = [_typed(value)]
        body["metadata"] = metadata
        if self.team_name:
            body["team_name"] = self.team_name
        found: list[Incident] = []

        def created_anyway() -> bool:
            incident = self.find_incident(key_name, key_value, scope=scope)
            if incident is not None:
                found.append(incident)
            return incident is not None

        response = self._send("POST", INCIDENTS_PATH, json=body, ok=(201,), before_resend=created_anyway)
        if response is None:
            return replace(found[0], recovered=True)
        incident = _incident_from(self._body(response).get("data"))
        if incident is None:
            raise self._error(f"POST {INCIDENTS_PATH}: 201 without data.id: {_excerpt(response)}", 201)
        return incident

    def find_incident(
        self, key_name: str, key_value: str, *, scope: Mapping[str, str] | None = None
    ) -> Incident | None:
        """The incident whose metadata ``key_name`` has ``key_value`` and whose metadata matches
        every ``scope`` entry exactly (``name: [value]``), resolved or not, if any.

        Uses Better Stack's metadata filter on the key and follows ``pagination.next``; each
        candidate's metadata — key and scope — is checked here, so neither a server that ignored
        the filter nor an incident someone else created with the same key can be taken for ours.
        """
        params: dict[str, Any] | None = {f"metadata[{key_name}][][value]": key_value, "per_page": PAGE_SIZE}
        if self.team_name:
            assert params is not None
            params["team_name"] = self.team_name
        url = INCIDENTS_PATH
        for _ in range(MAX_PAGES):
            response = self._send("GET", url, params=params, ok=(200,))
            assert response is not None
            page = self._body(response)
            for item in page.get("data") or []:
                incident = _incident_from(item)
                if incident is not None and incident.matches(key_name, key_value, scope or {}):
                    return incident
            next_url = (page.get("pagination") or {}).get("next")
            if not next_url:
                return None
            url, params = self._same_origin(next_url), None
        raise BetterStackError(f"GET {INCIDENTS_PATH}: more than {MAX_PAGES} pages for one metadata key")

    def resolve_incident(self, incident_id: str, *, resolved_by: str) -> bool:
        """Resolve an incident: True if this call resolved it, False if it was already resolved (409).

        A 404 raises :class:`IncidentNotFound` (not retried, like any other 4xx).
        """
        path = f"{INCIDENTS_PATH}/{_path_segment(incident_id)}/resolve"
        response = self._send("POST", path, json={"resolved_by": resolved_by}, ok=(200, 201, 404, 409))
        assert response is not None
        if response.status_code == 404:
            raise self._error(f"POST {path}: HTTP 404: {_excerpt(response)}", 404, IncidentNotFound)
        return response.status_code != 409

    def close(self) -> None:
        """Close the connection pool; the next request opens a new one."""
        if self._http is not None:
            self._http.close()
            self._http = None

    # --- transport ----------------------------------------------------------------------------
    def _client(self) -> httpx.Client:
        if self._http is None:
            self._http = httpx.Client(
                base_url=self.base_url,
                timeout=self.timeout,
                headers={
                    "Authorization": f"Bearer {self._token}",
                    "Accept": "application/json",
                    "User-Agent": "core-jobs-alerts",
                },
                follow_redirects=False,
            )
        return self._http

    def _throttle(self) -> None:
        """Wait for this request's slot: requests start at least 1/rate seconds apart."""
        now = self._monotonic()
        start = max(now, self._next_slot)
        if start > now:
            self._sleep(start - now)
        self._next_slot = start + self._interval

    def _send(
        self,
        method: str,
        url: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        ok: tuple[int, ...],
        before_resend: Callable[[], bool] | None = None,
    ) -> httpx.Response | None:
        """Send with rate limit and bounded retries; None when ``before_resend`` said it is done."""
        path = urlsplit(url).path or url
        attempt = 0
        while True:
            attempt += 1
            self._throttle()
            retry_after: str | None = None
            try:
                response = self._client().request(method, url, json=json, params=params)
            except httpx.TransportError as exc:
                reason = f"{type(exc).__name__}: {exc}".rstrip(": ")
                may_have_arrived = not isinstance(exc, _NOT_SENT)
            else:
                status = response.status_code
                if status in ok:
                    return response
                if status != 429 and status < 500:
                    raise self._error(f"{method} {path}: HTTP {status}: {_excerpt(response)}", status)
                reason = f"HTTP {status}"
                retry_after = response.headers.get("Retry-After")
                may_have_arrived = status != 429  # a 429 was refused before any processing
            if attempt >= self.retry_policy.max_attempts:
                raise self._error(f"{method} {path}: gave up after {attempt} attempts; last: {reason}", None)
            delay = compute_delay(self.retry_policy, attempt, retry_after=retry_after, random=self._random)
            self._log.warning(
                "alerts.betterstack.retry",
                method=method,
                path=path,
                attempt=attempt,
                reason=reason,
                delay_s=round(delay.total_seconds(), 3),
            )
            self._sleep(delay.total_seconds())
            if may_have_arrived and before_resend is not None and before_resend():
                return None

    def _body(self, response: httpx.Response) -> dict[str, Any]:
        where = f"{response.request.method} {response.request.url.path}: HTTP {response.status_code}"
        try:
            body = response.json()
        except ValueError:
            raise self._error(f"{where} is not JSON: {_excerpt(response)}", response.status_code) from None
        if not isinstance(body, dict):
            raise self._error(f"{where}: expected a JSON object", response.status_code)
        return body

    def _error(
        self, message: str, status: int | None, kind: type[BetterStackError] = BetterStackError
    ) -> BetterStackError:
        """An error whose text can never carry the token, even if a server echoed it back."""
        return kind(message.replace(self._token, "***"), status=status)

    def _same_origin(self, url: str) -> str:
        """A pagination link, refused unless it points at the configured API (the token goes along)."""
        target, base = urlsplit(url), urlsplit(self.base_url)
        if not target.scheme and not target.netloc:
            return url
        if (target.scheme, target.netloc) != (base.scheme, base.netloc):
            raise self._error(
                f"pagination.next points at another origin ({target.scheme}://{target.netloc}); not followed", None
            )
        return url


def _typed(value: str) -> dict[str, str]:
    """One metadata value as Better Stack types it."""
    return {"type": "String", "value": str(value)}


def _incident_from(data: Any) -> Incident | None:
    if not isinstance(data, Mapping):
        return None
    incident_id = data.get("id")
    if incident_id is None or str(incident_id).strip() == "":
        return None
    raw_attributes = data.get("attributes")
    attributes: Mapping[str, Any] = raw_attributes if isinstance(raw_attributes, Mapping) else {}
    raw_metadata = attributes.get("metadata")
    metadata: Mapping[str, Any] = raw_metadata if isinstance(raw_metadata, Mapping) else {}
    return Incident(id=str(incident_id), status=attributes.get("status"), metadata=metadata)


def _excerpt(response: httpx.Response) -> str:
    text = response.text.strip().replace("\n", " ")
    return text[:ERROR_BODY_CHARS] + ("…" if len(text) > ERROR_BODY_CHARS else "") if text else "(empty body)"


def _path_segment(value: str) -> str:
    if not value or "/" in value or value in (".", ".."):
        raise BetterStackError(f"invalid incident id {value!r}")
    return value


def betterstack_client(settings: AlertsFields, *, retry_after_max: timedelta | None = None) -> BetterStackClient | None:
    """The client of the settings (``BETTERSTACK_*``), or None (a dry run) when no token is configured.

    ``retry_after_max``: the platform's bound on an honoured Retry-After (``CORE_JOBS_RETRY_AFTER_MAX``, the job
    env's); None keeps :data:`DEFAULT_RETRY_POLICY`'s.
    """
    from maintenance.runtime.logs import get_logger

    if settings.betterstack_api_token is None:
        return None
    policy = replace(DEFAULT_RETRY_POLICY, max_attempts=settings.betterstack_max_retries + 1)
    if retry_after_max is not None:
        policy = replace(policy, retry_after_cap=max(retry_after_max, timedelta(0)))
    return BetterStackClient(
        settings.betterstack_api_url,
        settings.betterstack_api_token.get_secret_value(),
        team_name=settings.betterstack_team_name,
        timeout=settings.betterstack_timeout.total_seconds(),
        retry_policy=policy,
        max_requests_per_second=settings.betterstack_max_requests_per_second,
        log=get_logger(job="alerts"),
    )
