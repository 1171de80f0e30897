"""Secrets for the collectors: basic-auth username/password and CA bundles, read through an injected reader.

The reader is the handlers' business (it reads the Secret in the NodeConfig's own namespace, where the
operator's Role grants `get secrets`); it returns the Secret's decoded data, or None when there is no such
Secret. A missing Secret or key is InvalidConfig: nothing but a user's change fixes it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from rmd_operator.telemetry.errors import INVALID_CONFIG, CollectError
from rmd_operator.telemetry.spec import EndpointTerm
from rmd_operator.telemetry.tls import Trust

# (namespace, name) -> the Secret's data with values decoded, or None if it does not exist.
SecretReader = Callable[[str, str], Awaitable[Mapping[str, bytes] | None]]


@dataclass(frozen=True)
class BasicAuth:
    username: str
    password: str
    secret: str  # "namespace/name", for messages


async def _secret(reader: SecretReader, namespace: str, name: str, field: str) -> Mapping[str, bytes]:
    data = await reader(namespace, name)
    if data is None:
        raise CollectError(INVALID_CONFIG, f"{field}: Secret {namespace}/{name} not found")
    return data


async def basic_auth(reader: SecretReader, namespace: str, term: EndpointTerm) -> BasicAuth | None:
    if term.basic_auth_secret is None:
        return None
    name = term.basic_auth_secret
    data = await _secret(reader, namespace, name, f"{term.field}.basicAuthSecret")
    missing = [key for key in ("username", "password") if key not in data]
    if missing:
        raise CollectError(
            INVALID_CONFIG,
            f"{term.field}.basicAuthSecret: Secret {namespace}/{name} has no key {', '.join(missing)}",
        )
    return BasicAuth(data["username"].decode(), data["password"].decode(), f"{namespace}/{name}")


async def trust(reader: SecretReader, namespace: str, term: EndpointTerm) -> Trust:
    if term.insecure_skip_verify:
        return Trust(insecure=True)
    if term.ca_secret is None:
        return Trust()
    ref = term.ca_secret
    data = await _secret(reader, namespace, ref.name, f"{term.field}.caBundleSecret")
    if ref.key not in data:
        raise CollectError(
            INVALID_CONFIG, f"{term.field}.caBundleSecret: Secret {namespace}/{ref.name} has no key {ref.key}"
        )
    return Trust(ca_pem=data[ref.key].decode())
