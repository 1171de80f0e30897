"""Where the agent's Kubernetes API server is and how the agent authenticates to it: the pod's service account
(in-cluster, what the chart runs) or a kubeconfig file (tests and development). Everything is read once,
when the client is made, except the bearer token file, which kube_api.TokenFile reads again while the agent
runs (service-account tokens rotate).

From a kubeconfig the agent takes the current context (or the file's only one); the cluster's `server`
(https only), `certificate-authority(-data)`, `tls-server-name` and `proxy-url` (http or https); the user's
`client-certificate(-data)`, `client-key(-data)`, `token`, `tokenFile` and impersonation (`as`, `as-uid`,
`as-groups`, `as-user-extra`). Relative paths are relative to the file's directory, as for kubectl. What
would need more than that is refused by name rather than half-done: credential plugins (`exec`,
`auth-provider`), basic auth and `insecure-skip-tls-verify`.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import yaml

from rmd_agent.errors import ConfigError

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")

# Refused when present: (section, key, why).
_UNSUPPORTED = (
    ("user", "exec", "a credential plugin"),
    ("user", "auth-provider", "a credential plugin"),
    ("user", "username", "basic auth"),
    ("user", "password", "basic auth"),
)


@dataclass(frozen=True)
class ClusterConfig:
    """How to reach one API server. `source` names where it came from, for messages."""

    server: str  # https://host:port, perhaps with a path prefix
    ca_pem: bytes | None = None  # the server's CA; None: the system's trust store
    tls_server_name: str | None = None  # the name the server's certificate must have, if not its host's
    client_cert_pem: bytes | None = None
    client_key_pem: bytes | None = None
    token: str | None = None  # the bearer token (as read at start when it comes from token_file)
    token_file: Path | None = None  # read again while the agent runs
    proxy_url: str | None = None  # only as written in a kubeconfig, never from the environment
    headers: tuple[tuple[str, str], ...] = ()  # impersonation, sent with every request
    source: str = ""


def load_in_cluster(
    environ: Mapping[str, str] = os.environ, account_dir: Path = SERVICE_ACCOUNT_DIR
) -> ClusterConfig:
    """The pod's service account: the API server's Service from the environment the kubelet sets, the
    token and CA the kubelet mounts."""
    where = "in-cluster config"
    host = environ.get("KUBERNETES_SERVICE_HOST", "")
    port = environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise _error(where, "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set (not in a pod?)")
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    token_file = account_dir / "token"
    return ClusterConfig(
        server=f"https://{host}:{port}",
        ca_pem=_read(account_dir / "ca.crt", where),
        token=read_token(token_file, where),
        token_file=token_file,
        source=where,
    )


def load_kubeconfig(path: Path) -> ClusterConfig:
    where = f"kubeconfig {path}"
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise _error(where, exc.strerror or str(exc)) from None
    except yaml.YAMLError as exc:
        raise _error(where, f"not YAML: {exc}") from None
    if not isinstance(doc, dict):
        raise _error(where, "not a kubeconfig (a YAML mapping)")
    cluster_name, cluster, user_name, user = _current_context(doc, where)
    for section, option, why in _UNSUPPORTED:
        if option in {"user": user, "cluster": cluster}[section]:
            named = cluster_name if section == "cluster" else user_name
            raise _error(
                where, f"{section} {named!r} uses {option} ({why}), which the agent does not support"
            )
    if cluster.get("insecure-skip-tls-verify"):
        raise _error(where, f"cluster {cluster_name!r}: insecure-skip-tls-verify is not supported")
    server = str(cluster.get("server") or "")
    if urlsplit(server).scheme != "https" or not urlsplit(server).hostname:
        raise _error(where, f"cluster {cluster_name!r}: server {server!r} is not an https:// URL")
    proxy = str(cluster.get("proxy-url") or "") or None
    if proxy is not None and urlsplit(proxy).scheme not in ("http", "https"):
        raise _error(
            where, f"cluster {cluster_name!r}: proxy-url {proxy!r} is not an http:// or https:// URL"
        )
    base = path.parent
    cert = _data_or_file(user, "client-certificate", base, where)
    key = _data_or_file(user, "client-key", base, where)
    if (cert is None) != (key is None):
        raise _error(where, f"user {user_name!r}: client-certificate and client-key go together")
    token_file = base / str(user["tokenFile"]) if user.get("tokenFile") else None
    return ClusterConfig(
        server=server,
        ca_pem=_data_or_file(cluster, "certificate-authority", base, where),
        tls_server_name=str(cluster.get("tls-server-name") or "") or None,
        client_cert_pem=cert,
        client_key_pem=key,
        token=read_token(token_file, where) if token_file else (str(user.get("token") or "") or None),
        token_file=token_file,
        proxy_url=proxy,
        headers=_impersonation(user),
        source=where,
    )


def _current_context(
    doc: Mapping[str, Any], where: str
) -> tuple[str, Mapping[str, Any], str, Mapping[str, Any]]:
    """The cluster and user (name and entry each) of the current context, or of the file's only context. A
    context without a user is anonymous."""
    contexts = _named(doc, "contexts", "context", where)
    name = doc.get("current-context") or None
    if name is None:
        if len(contexts) != 1:
            raise _error(where, f"no current-context, and {len(contexts)} contexts to choose from")
        (name,) = contexts
    if name not in contexts:
        raise _error(where, f"no context {name!r}")
    context = contexts[name]
    clusters = _named(doc, "clusters", "cluster", where)
    cluster_name = str(context.get("cluster"))
    if cluster_name not in clusters:
        raise _error(where, f"context {name!r}: no cluster {cluster_name!r}")
    user_name = str(context.get("user") or "")
    if not user_name:
        return cluster_name, clusters[cluster_name], user_name, {}
    users = _named(doc, "users", "user", where)
    if user_name not in users:
        raise _error(where, f"context {name!r}: no user {user_name!r}")
    return cluster_name, clusters[cluster_name], user_name, users[user_name]


def read_token(path: Path, where: str) -> str:
    """A bearer token file's token. ConfigError when it is unreadable or empty."""
    token = _read(path, where).decode("utf-8", "replace").strip()
    if not token:
        raise _error(where, f"the token file {path} is empty")
    return token


def _impersonation(user: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """The Impersonate-* headers kubectl sends for the user's `as`, `as-uid`, `as-groups`, `as-user-extra`."""
    headers = []
    if user.get("as"):
        headers.append(("Impersonate-User", str(user["as"])))
    if user.get("as-uid"):
        headers.append(("Impersonate-Uid", str(user["as-uid"])))
    headers += [("Impersonate-Group", str(group)) for group in user.get("as-groups") or ()]
    for key, values in (user.get("as-user-extra") or {}).items():
        headers += [(f"Impersonate-Extra-{quote(str(key), safe='')}", str(v)) for v in values or ()]
    return tuple(headers)


def _named(doc: Mapping[str, Any], key: str, inner: str, where: str) -> dict[str, Mapping[str, Any]]:
    """A kubeconfig list of {name, <inner>: {...}} as {name: {...}}."""
    found = {}
    for item in doc.get(key) or ():
        if not isinstance(item, dict) or not isinstance(item.get(inner) or {}, dict):
            raise _error(where, f"{key}: an entry is not a mapping with a name and a {inner}")
        found[str(item.get("name"))] = item.get(inner) or {}
    return found


def _data_or_file(section: Mapping[str, Any], key: str, base: Path, where: str) -> bytes | None:
    """`<key>-data` (base64) or the file `<key>`, relative to the kubeconfig's directory; None if neither."""
    data = section.get(f"{key}-data")
    if data:
        try:
            return base64.b64decode(str(data), validate=True)
        except (binascii.Error, ValueError):
            raise _error(where, f"{key}-data is not base64") from None
    if section.get(key):
        return _read(base / str(section[key]), where)
    return None


def _read(path: Path, where: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise _error(where, f"cannot read {path}: {exc.strerror or exc}") from None


def _error(where: str, what: str) -> ConfigError:
    return ConfigError(f"cannot configure the Kubernetes client from the {where}: {what}")
