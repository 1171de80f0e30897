"""Read what the checks need from the API server into a Snapshot: only reads (get and list), in the
release namespace, the scheduler namespaces, and cluster-wide for Nodes, NodeResourceTopologies and the CRDs.

Objects are kept as the API returns them (JSON), and the API server's Date header gives the time the checks
compare Leases and certificates with, so this machine's clock does not matter. A read refused for lack of
rights is noted in Snapshot.unreadable (reported by the access check); an API server that cannot be reached,
or refuses the credentials, stops the run (CannotValidate)."""

from __future__ import annotations

import base64
import contextlib
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import urllib3
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from rmd_api.names import NODE_RESOURCE_TOPOLOGY, RMD_NODE_STATE
from rmd_api.node_state import LEASE_LABEL, LEASE_LABEL_VALUE, LEASE_PREFIX, NAME_PREFIX
from rmd_operator.validate.expected_crds import EXPECTED_CRDS
from rmd_operator.validate.snapshot import (
    AGENT_COMPONENT,
    COMPONENT_LABEL,
    Obj,
    PeerCertificate,
    Snapshot,
    is_rmd,
    name_of,
)
from rmd_operator.validate.tls_peer import peer_certificates

DEFAULT_KUBECONFIG = "~/.kube/config"


class CannotValidate(Exception):
    """No usable kubeconfig, or an API server that cannot be reached or refuses the credentials."""


@dataclass(frozen=True)
class Options:
    namespace: str
    scheduler_name: str | None = None
    scheduler_namespaces: tuple[str, ...] = ()
    certificates: bool = True  # read each agent's serving certificate at its endpoint
    timeout: float = 5.0  # seconds, per API request and per TLS handshake


def api_client(kubeconfig: str | None, context: str | None) -> Any:
    """A client configured like kubectl: --kubeconfig, else $KUBECONFIG (a list of files), else
    ~/.kube/config, with --context; in a pod without any of them, the pod's service account."""
    path = kubeconfig or os.environ.get("KUBECONFIG") or DEFAULT_KUBECONFIG
    configuration = client.Configuration()
    try:
        config.load_kube_config(config_file=path, context=context, client_configuration=configuration)  # type: ignore[no-untyped-call]
    except (ConfigException, OSError) as exc:
        missing = (
            not kubeconfig
            and not os.environ.get("KUBECONFIG")
            and not os.path.exists(os.path.expanduser(path))
        )
        if not (missing and context is None and os.environ.get("KUBERNETES_SERVICE_HOST")):
            raise CannotValidate(f"kubeconfig {path}: {exc}") from None
        try:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except ConfigException as incluster:
            raise CannotValidate(f"no kubeconfig, and not usable in this pod: {incluster}") from None
    return client.ApiClient(configuration=configuration)


class Collector:
    def __init__(self, api: Any, options: Options) -> None:
        self.options = options
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.leases = client.CoordinationV1Api(api)
        self.objects = client.CustomObjectsApi(api)
        self.extensions = client.ApiextensionsV1Api(api)
        self.unreadable: dict[str, str] = {}
        self.now: datetime | None = None

    def read(self, what: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Obj | None:
        """One GET as JSON; None if it is not found, or not allowed (noted as unreadable)."""
        try:
            response = call(*args, _preload_content=False, _request_timeout=self.options.timeout, **kwargs)
        except ApiException as exc:
            if exc.status == 404:
                return None
            if exc.status == 403:
                self.unreadable[what] = f"forbidden ({_api_message(exc)})"
                return None
            if exc.status == 401:
                raise CannotValidate(f"the API server refused the credentials: {_api_message(exc)}") from None
            raise CannotValidate(f"reading {what}: {exc.status} {_api_message(exc)}") from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise CannotValidate(f"cannot reach the API server: {exc}") from None
        self._note_date(response.headers.get("Date"))
        body: Obj = json.loads(response.data)
        return body

    def items(self, what: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Obj]:
        listed = self.read(what, call, *args, **kwargs)
        return list((listed or {}).get("items") or [])

    def _note_date(self, header: str | None) -> None:
        if not header:
            return
        with contextlib.suppress(TypeError, ValueError):
            self.now = parsedate_to_datetime(header).astimezone(UTC)

    def collect(self) -> Snapshot:
        ns, opts = self.options.namespace, self.options
        namespaces = sorted({ns, *opts.scheduler_namespaces})
        nodes = {name_of(n): n for n in self.items("nodes", self.core.list_node)}
        states: dict[str, Obj] = {}
        for state in self.items(
            f"rmdnodestates in {ns}",
            self.objects.list_namespaced_custom_object,
            RMD_NODE_STATE.group,
            RMD_NODE_STATE.version,
            ns,
            RMD_NODE_STATE.plural,
        ):
            node = (state.get("spec") or {}).get("node") or name_of(state).removeprefix(NAME_PREFIX)
            states[str(node)] = state
        leases = {
            name_of(lease).removeprefix(LEASE_PREFIX): lease
            for lease in self.items(
                f"leases in {ns}",
                self.leases.list_namespaced_lease,
                ns,
                label_selector=f"{LEASE_LABEL}={LEASE_LABEL_VALUE}",
            )
        }
        nrts = {
            name_of(nrt): nrt
            for nrt in self.items(
                "noderesourcetopologies",
                self.objects.list_cluster_custom_object,
                NODE_RESOURCE_TOPOLOGY.group,
                NODE_RESOURCE_TOPOLOGY.version,
                NODE_RESOURCE_TOPOLOGY.plural,
            )
        }
        crds: dict[str, Obj | None] = {}
        for name in sorted(EXPECTED_CRDS):
            crd = self.read(
                f"customresourcedefinition {name}", self.extensions.read_custom_resource_definition, name
            )
            if f"customresourcedefinition {name}" not in self.unreadable:
                crds[name] = crd
        deployments = self._in(namespaces, "deployments", self.apps.list_namespaced_deployment)
        daemonsets = self.items(f"daemonsets in {ns}", self.apps.list_namespaced_daemon_set, ns)
        pods = self.items(f"pods in {ns}", self.core.list_namespaced_pod, ns, label_selector=COMPONENT_LABEL)
        configmaps = self._in(namespaces, "configmaps", self.core.list_namespaced_config_map)
        certificates: dict[str, PeerCertificate] = {}
        if opts.certificates:
            certificates = self._certificates(states, daemonsets)
        return Snapshot(
            namespace=ns,
            now=self.now or datetime.now(UTC),
            nodes=nodes,
            node_states=states,
            leases=leases,
            nrts=nrts,
            crds=crds,
            deployments=deployments,
            daemonsets=daemonsets,
            pods=pods,
            configmaps=configmaps,
            certificates=certificates,
            unreadable=dict(self.unreadable),
            scheduler_name=opts.scheduler_name,
            scheduler_namespaces=opts.scheduler_namespaces,
        )

    def _in(self, namespaces: Iterable[str], kind: str, call: Callable[..., Any]) -> list[Obj]:
        found: list[Obj] = []
        for namespace in namespaces:
            found += self.items(f"{kind} in {namespace}", call, namespace)
        return found

    def _certificates(self, states: dict[str, Obj], daemonsets: list[Obj]) -> dict[str, PeerCertificate]:
        endpoints = {}
        missing = {}
        for node, state in states.items():
            endpoint = (state.get("status") or {}).get("endpoint")
            if isinstance(endpoint, str) and endpoint:
                endpoints[node] = endpoint
            else:
                missing[node] = PeerCertificate(None, "", "the agent publishes no endpoint")
        found = peer_certificates(endpoints, self.options.timeout)
        if any(p.der is None for p in found.values()):
            shared = self._shared_certificate(daemonsets)
            if shared is not None:  # the same certificate every agent serves
                found = {node: p if p.der is not None else shared for node, p in found.items()}
        return {**missing, **found}

    def _shared_certificate(self, daemonsets: list[Obj]) -> PeerCertificate | None:
        """With tls.agentCertificates: shared, the chart's `<agent DaemonSet>-tls` Secret holds the one
        certificate of every agent: read when an endpoint cannot be reached (from outside the pod network)."""
        agents = [d for d in daemonsets if is_rmd(d, AGENT_COMPONENT)]
        if not agents:
            return None
        name = f"{name_of(agents[0])}-tls"
        what = f"secret {self.options.namespace}/{name}"
        secret = self.read(what, self.core.read_namespaced_secret, name, self.options.namespace)
        self.unreadable.pop(what, None)  # without the right, the endpoint's answer stands
        pem = ((secret or {}).get("data") or {}).get("tls.crt")
        if not isinstance(pem, str):
            return None
        try:
            der = x509.load_pem_x509_certificate(base64.b64decode(pem)).public_bytes(Encoding.DER)
        except ValueError as exc:
            return PeerCertificate(None, f"Secret {self.options.namespace}/{name}", f"unreadable: {exc}")
        return PeerCertificate(der, f"Secret {self.options.namespace}/{name}")


def _api_message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "{}").get("message") or exc.reason)
    except (ValueError, AttributeError):
        return str(exc.reason)


def collect(api: Any, options: Options) -> Snapshot:
    return Collector(api, options).collect()
