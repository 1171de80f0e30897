"""The agent's Kubernetes API client: JSON requests to one API server over a urllib3 connection pool.

The agent writes a few objects of its own node (kube.KubeObjectClient: RmdNodeState, NodeResourceTopology,
its Lease) and asks for its serving certificate (server/serving_cert.py), all as plain JSON. The kubernetes
package would do the same with every API and model class loaded (about 30 MiB of the agent's 60 MiB budget,
issue #14), so the agent has this instead; the operator keeps the kubernetes package.

TLS is verified against the cluster's CA only (the system's trust store only when the kubeconfig names no
CA). No proxy comes from the environment: urllib3 never reads HTTPS_PROXY, and an HTTPS_PROXY meant for image
pulls or outbound traffic must not see the agent's token; a kubeconfig's `proxy-url` is used as written.
The bearer token file is read again every TOKEN_REREAD_SECONDS, as client-go does: the kubelet rotates a
pod's bound token well before it expires.

Requests are synchronous (urllib3); `call` runs one in a worker thread. Errors are KubeApiError: the API
server's answer (status, reason, body), or KubeConnectionError (status 0) when no answer came.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote, urlencode

import urllib3
from urllib3.exceptions import HTTPError, MaxRetryError

from rmd_agent.errors import ConfigError, KubeApiError, KubeConnectionError
from rmd_agent.kube_config import ClusterConfig, read_token

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_SECONDS = 10.0
TOKEN_REREAD_SECONDS = 60.0
RETRIES = 3  # for connection errors (and read errors of idempotent requests): urllib3's default, as before
JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"

Obj = dict[str, Any]


def object_path(
    group: str,
    version: str,
    plural: str,
    *,
    namespace: str | None = None,
    name: str | None = None,
    subresource: str | None = None,
) -> str:
    """The API path of a collection or one object: /api/v1/... for the core group (""), else /apis/..."""
    parts = ["/api", version] if not group else ["/apis", group, version]
    if namespace is not None:
        parts += ["namespaces", quote(namespace, safe="")]
    parts.append(plural)
    if name is not None:
        parts.append(quote(name, safe=""))
        if subresource:
            parts.append(subresource)
    return "/".join(parts)


class TokenFile:
    """A bearer token file, read again when the last reading is `period` seconds old. A reading that fails
    keeps the token held (logged): the file is replaced by the kubelet atomically, so this is rare and
    transient."""

    def __init__(
        self,
        path: Path,
        token: str,
        *,
        period: float = TOKEN_REREAD_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.period = period
        self._clock = clock
        self._token = token
        self._read_at = clock()
        self._lock = threading.Lock()

    def token(self) -> str:
        with self._lock:
            now = self._clock()
            if now - self._read_at >= self.period:
                self._read_at = now
                try:
                    self._token = read_token(self.path, "token file")
                except ConfigError as exc:
                    log.warning("keeping the bearer token read before: %s", exc)
            return self._token


class KubeApi:
    """Requests to the API server of `config`. Thread-safe; close() when done (also a context manager)."""

    def __init__(
        self,
        config: ClusterConfig,
        *,
        timeout: float = REQUEST_TIMEOUT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.server = config.server.rstrip("/")
        self._headers = urllib3.HTTPHeaderDict({"Accept": JSON, "User-Agent": "rmd-agent"})
        for name, value in config.headers:
            self._headers.add(name, value)
        self._token = config.token
        self._token_file = None
        if config.token_file is not None and config.token is not None:
            self._token_file = TokenFile(config.token_file, config.token, clock=clock)
        pool_options: Any = {
            "ssl_context": ssl_context(config),
            "retries": urllib3.Retry(total=RETRIES, redirect=False),  # the API server does not redirect
            "timeout": urllib3.Timeout(total=timeout),
        }
        if config.tls_server_name:
            pool_options["server_hostname"] = config.tls_server_name  # for SNI and the certificate's check
        self._pool = (
            urllib3.ProxyManager(config.proxy_url, **pool_options)
            if config.proxy_url
            else urllib3.PoolManager(**pool_options)
        )

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = JSON,
    ) -> Obj:
        """One request; the answer's JSON object. KubeApiError for any answer but 2xx, KubeConnectionError
        when there is no answer."""
        url = self.server + path + (f"?{urlencode(query)}" if query else "")
        headers = urllib3.HTTPHeaderDict(self._headers)
        token = self._token_file.token() if self._token_file else self._token
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        try:
            response = self._pool.request(method, url, body=data, headers=headers)
        except HTTPError as exc:
            cause = exc.reason if isinstance(exc, MaxRetryError) and exc.reason else exc
            raise KubeConnectionError(f"{method} {self.server}{path}: no answer: {cause}") from None
        text = response.data.decode("utf-8", "replace")
        if not 200 <= response.status < 300:
            raise KubeApiError(response.status, response.reason or "", text)
        try:
            found = json.loads(text)
        except ValueError:
            found = None
        if not isinstance(found, dict):
            raise KubeApiError(response.status, "the answer is not a JSON object", text)
        return found

    async def call(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = JSON,
    ) -> Obj:
        """request() in a worker thread."""
        request = functools.partial(
            self.request, method, path, query=query, body=body, content_type=content_type
        )
        return await asyncio.to_thread(request)

    def close(self) -> None:
        self._pool.clear()

    def __enter__(self) -> KubeApi:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def ssl_context(config: ClusterConfig) -> ssl.SSLContext:
    """Verifies the server against the cluster's CA (hostname included); presents the client certificate."""
    try:
        if config.ca_pem is None:
            context = ssl.create_default_context()
        else:
            context = ssl.create_default_context(cadata=config.ca_pem.decode("ascii"))
    except (ssl.SSLError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise ConfigError(
            f"cannot configure the Kubernetes client from the {config.source}: the certificate authority "
            f"is not a PEM certificate ({exc})"
        ) from None
    if config.client_cert_pem is not None and config.client_key_pem is not None:
        _load_client_certificate(context, config.client_cert_pem, config.client_key_pem, config.source)
    return context


def _load_client_certificate(context: ssl.SSLContext, cert_pem: bytes, key_pem: bytes, source: str) -> None:
    # ssl loads a key pair from files only: they exist (owner-only) just while it is loaded.
    with tempfile.TemporaryDirectory(prefix="rmd-agent-kube-") as tmp:
        paths = Path(tmp) / "client.crt", Path(tmp) / "client.key"
        for path, data in zip(paths, (cert_pem, key_pem), strict=True):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(data)
        try:
            context.load_cert_chain(*paths)
        except ssl.SSLError as exc:
            raise ConfigError(
                f"cannot configure the Kubernetes client from the {source}: the client certificate and key "
                f"cannot be loaded ({exc.reason or exc})"
            ) from None
