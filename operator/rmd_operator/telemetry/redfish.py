"""Redfish over sushy (OpenStack's Redfish client): the inlet temperature and the predictor's endpoint.

sushy does the transport: TLS verification (a CA bundle path, or off only when asked), basic auth, the
Redfish request headers, timeouts, and the mapping of HTTP answers to exceptions; its service root and
collections find the chassis and systems. sushy models the legacy Thermal resource but neither
ThermalSubsystem/ThermalMetrics, the Sensor resources the vendors use, nor the MachineLearningModel
extension, so the documents themselves are read as JSON and parsed in parse.py, the same way for all.

sushy is synchronous: a `Bmc` lives in one runner and is called from a worker thread, one call at a time.
Every request gets the time left before the fetch's deadline as its timeout.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import requests
import sushy
from sushy import auth as sushy_auth
from sushy import connector as sushy_connector
from sushy import exceptions as sushy_exc

from rmd_operator.telemetry import parse
from rmd_operator.telemetry.credentials import BasicAuth
from rmd_operator.telemetry.errors import (
    BAD_RESPONSE,
    TLS_ERROR,
    UNAUTHORIZED,
    UNREACHABLE,
    CollectError,
)
from rmd_operator.telemetry.parse import InletPath
from rmd_operator.telemetry.tls import CAFile, Trust, ssl_detail

log = logging.getLogger(__name__)

ROOT = "/redfish/v1/"
# The answers that end a search for the inlet sensor at once: trying further paths cannot help.
_FATAL = frozenset({UNREACHABLE, UNAUTHORIZED, TLS_ERROR})


class _NoAuth(sushy_auth.AuthBase):  # type: ignore[misc]
    """For a BMC without a basicAuthSecret: sushy's default would try to open a session."""

    def _do_authenticate(self) -> None:
        pass

    def can_refresh_session(self) -> bool:
        return False


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def classify(exc: Exception, url: str, auth: BasicAuth | None) -> CollectError:
    """A sushy (or requests) exception as a CollectError with a message a user can act on."""
    if isinstance(exc, CollectError):
        return exc
    if isinstance(exc, sushy_exc.AccessError):
        who = (
            f"the credentials of Secret {auth.secret}" if auth else "the request (no basicAuthSecret is set)"
        )
        return CollectError(UNAUTHORIZED, f"HTTP {exc.status_code} from {url}: the BMC refused {who}")
    if isinstance(exc, sushy_exc.ConnectionError):
        for cause in _chain(exc):
            if isinstance(cause, requests.exceptions.SSLError):
                return CollectError(
                    TLS_ERROR,
                    f"TLS with {url} failed: {ssl_detail(str(cause))}; trust its CA with caBundleSecret "
                    "(or set insecureSkipVerify: true)",
                )
        cause = next((c for c in _chain(exc)[1:]), exc)
        return CollectError(UNREACHABLE, f"cannot reach {url}: {type(cause).__name__}: {cause}")
    if isinstance(exc, sushy_exc.ServerSideError):
        return CollectError(BAD_RESPONSE, f"HTTP {exc.status_code} from {url}", retryable=True)
    if isinstance(exc, sushy_exc.HTTPError):
        return CollectError(BAD_RESPONSE, f"HTTP {exc.status_code} from {url}")
    if isinstance(exc, ValueError):  # the body is not JSON (requests' JSONDecodeError is a ValueError)
        return CollectError(BAD_RESPONSE, f"{url} did not answer JSON: {exc}")
    return CollectError(BAD_RESPONSE, f"{url}: {type(exc).__name__}: {exc}")


class Bmc:
    """One BMC: base URL, credentials, trust. Blocking; call it from a worker thread."""

    def __init__(self, base_url: str, auth: BasicAuth | None, trust: Trust, request_timeout: float) -> None:
        self.base_url = base_url.rstrip("/")
        self.auth = auth
        self.trust = trust
        self._ca = CAFile(trust.ca_pem) if trust.ca_pem and not trust.insecure else None
        verify: bool | str = False if trust.insecure else (self._ca.path if self._ca else True)
        # server_side_retries=1: one attempt per request, the runner does the retries (with its backoff and
        # deadline); sushy's own would sleep seconds between them.
        self._conn = sushy_connector.Connector(
            self.base_url,
            verify=verify,
            server_side_retries=1,
            server_side_retries_delay=0.05,
            default_request_timeout=request_timeout,
            connect_timeout=request_timeout,
        )
        self._root: Any = None

    def close(self) -> None:
        self._conn.close()
        if self._ca is not None:
            self._ca.close()

    def _url(self, path: str) -> str:
        return f"{self.base_url}{path}"

    def _remaining(self, deadline: float) -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise CollectError(UNREACHABLE, f"{self.base_url}: no answer before the fetch deadline")
        return left

    def get(self, path: str, deadline: float) -> Mapping[str, Any]:
        try:
            doc = self._conn.get(path, timeout=self._remaining(deadline)).json()
        except Exception as exc:  # sushy/requests errors, classified; anything else is a bad answer too
            raise classify(exc, self._url(path), self.auth) from exc
        if not isinstance(doc, Mapping):
            raise CollectError(BAD_RESPONSE, f"{self._url(path)} did not answer a JSON object")
        return doc

    def _service_root(self) -> Any:
        if self._root is None:
            auth = sushy_auth.BasicAuth(self.auth.username, self.auth.password) if self.auth else _NoAuth()
            try:
                self._root = sushy.Sushy(self.base_url, auth=auth, connector=self._conn, root_prefix=ROOT)
            except Exception as exc:
                raise classify(exc, self._url(ROOT), self.auth) from exc
        return self._root

    def _collection(self, which: str) -> list[str]:
        root = self._service_root()
        try:
            found = root.get_chassis_collection() if which == "Chassis" else root.get_system_collection()
            return list(found.members_identities)
        except sushy_exc.MissingAttributeError:
            return []  # the service root links no such collection
        except Exception as exc:
            raise classify(exc, self._url(ROOT + which), self.auth) from exc

    # -- inlet temperature ------------------------------------------------------------------------------

    def standard_paths(self, deadline: float) -> list[InletPath]:
        """The DMTF-standard places of each chassis: ThermalSubsystem/ThermalMetrics, then legacy Thermal."""
        found: list[InletPath] = []
        for chassis in self._collection("Chassis"):
            try:
                doc = self.get(chassis, deadline)
                subsystem = parse.link(doc, "ThermalSubsystem")
                metrics = parse.link(self.get(subsystem, deadline), "ThermalMetrics") if subsystem else None
            except CollectError as exc:
                if exc.reason in _FATAL:
                    raise
                continue
            if metrics:
                found.append(InletPath(metrics, "ThermalMetrics", label=f"DMTF ThermalMetrics of {chassis}"))
            thermal = parse.link(doc, "Thermal")
            if thermal:
                found.append(InletPath(thermal, "Thermal", label=f"DMTF Thermal of {chassis}"))
        return found

    def read(self, path: InletPath, deadline: float) -> float:
        return parse.read_inlet(path, self.get(path.path, deadline))

    def inlet_temperature(self, remembered: InletPath | None, deadline: float) -> tuple[float, InletPath]:
        """The inlet temperature and where it was found: the remembered path first, else a new search
        (the DMTF-standard resources of every chassis, then WAO's vendor paths)."""
        if remembered is not None:
            try:
                return self.read(remembered, deadline), remembered
            except CollectError as exc:
                if exc.reason in _FATAL or exc.retryable:
                    raise
                log.info("inlet temperature no longer at %s (%s): searching again", remembered.path, exc)
        tried: list[str] = []
        for candidate in [*self.standard_paths(deadline), *parse.VENDOR_PATHS]:
            try:
                return self.read(candidate, deadline), candidate
            except CollectError as exc:
                if exc.reason in _FATAL:
                    raise
                tried.append(f"{candidate.path}: {exc.message}")
        raise CollectError(
            BAD_RESPONSE, f"no inlet temperature on {self.base_url}; tried " + "; ".join(tried or ["nothing"])
        )

    # -- the predictor's endpoint -----------------------------------------------------------------------

    def power_model(self, deadline: float) -> parse.ProvidedEndpoint:
        """The first system's MachineLearningModel: where its power-consumption model is served."""
        systems = self._collection("Systems")
        if not systems:
            raise CollectError(BAD_RESPONSE, f"{self._url(ROOT + 'Systems')} lists no system")
        return parse.machine_learning_model(self.get(f"{systems[0]}/MachineLearningModel", deadline))
