"""The pressure API and the V2 inference protocol over aiohttp.

aiohttp because the operator is asyncio and already ships it (kopf is built on it): no thread per call, no
new dependency, per-request timeouts, TLS contexts and basic auth built in. Both calls are one request
each; a client library for the inference protocol would bring a second HTTP stack for two JSON fields.
"""

from __future__ import annotations

import json
import ssl
from typing import Any

import aiohttp

from rmd_operator.telemetry.credentials import BasicAuth
from rmd_operator.telemetry.errors import BAD_RESPONSE, TLS_ERROR, UNAUTHORIZED, UNREACHABLE, CollectError
from rmd_operator.telemetry.tls import Trust, ssl_detail

_MAX_BODY = 1 << 20  # answers are a few hundred bytes; refuse to buffer a runaway one


def _auth(auth: BasicAuth | None) -> aiohttp.BasicAuth | None:
    return aiohttp.BasicAuth(auth.username, auth.password) if auth else None


async def request_json(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    *,
    budget: float,
    trust: Trust,
    auth: BasicAuth | None,
    body: Any = None,
) -> Any:
    """One request with a deadline; the decoded JSON answer, or a CollectError saying why not."""
    if budget <= 0:
        raise CollectError(UNREACHABLE, f"{url}: no answer before the fetch deadline")
    try:
        async with session.request(
            method,
            url,
            json=body,
            auth=_auth(auth),
            ssl=trust.ssl_context(),
            timeout=aiohttp.ClientTimeout(total=budget),
            headers={"Accept": "application/json"},
        ) as response:
            if response.status in (401, 403):
                who = (
                    f"the credentials of Secret {auth.secret}"
                    if auth
                    else "the request (no basicAuthSecret is set)"
                )
                raise CollectError(
                    UNAUTHORIZED, f"HTTP {response.status} from {url}: the server refused {who}"
                )
            text = (await response.content.read(_MAX_BODY)).decode("utf-8", "replace")
            if response.status >= 300:
                raise CollectError(
                    BAD_RESPONSE,
                    f"HTTP {response.status} from {url}: {text[:200]}",
                    retryable=response.status >= 500,
                )
    except (aiohttp.ClientSSLError, ssl.SSLError) as exc:
        raise CollectError(
            TLS_ERROR,
            f"TLS with {url} failed: {ssl_detail(str(exc))}; trust its CA with caBundleSecret "
            "(or set insecureSkipVerify: true)",
        ) from exc
    except (aiohttp.ClientConnectionError, TimeoutError) as exc:
        raise CollectError(UNREACHABLE, f"cannot reach {url}: {type(exc).__name__}: {exc}") from exc
    except aiohttp.ClientError as exc:
        raise CollectError(BAD_RESPONSE, f"{url}: {type(exc).__name__}: {exc}") from exc
    try:
        return json.loads(text)
    except ValueError as exc:
        raise CollectError(BAD_RESPONSE, f"{url} did not answer JSON: {text[:200]!r}") from exc
