"""NodeConfigTemplates on a real API server, kept by the real operator (`rmd-operator run` as a process):
a NodeConfig per selected node, rendered with the node's hostname and address, following the Nodes' labels
both ways and their deletion; template errors, refused renderings and conflicts reported in the template's
status and Events; the NodeConfigs removed with their template (the garbage collector, owner references).

The Nodes are plain Node objects (no kubelet): a name unique to the test, labels, and an InternalIP written
through the status subresource as a kubelet would.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kube_clients import KubeClients
from operator_process import Operator
from rmd_api.names import NODE_CONFIG, NODE_CONFIG_TEMPLATE
from rmd_sim.control_plane import ControlPlane

pytestmark = pytest.mark.e2e

GROUP, VERSION = NODE_CONFIG.group, NODE_CONFIG.version
WAIT = 30.0
INSTANCE_TYPE = "node.kubernetes.io/instance-type"
REDFISH = {INSTANCE_TYPE: "redfish-enabled"}
_T = TypeVar("_T")
Obj = dict[str, Any]


# --- the test's cluster ------------------------------------------------------------------------------------


@dataclass
class Env(KubeClients):
    api: Any
    namespace: str
    tag: str  # makes the test's (cluster-scoped) Node names unique
    operator: Operator
    nodes: list[str]

    def node_name(self, short: str) -> str:
        return f"{short}-{self.tag}"

    def add_node(self, short: str, labels: dict[str, str], ip: str | None) -> str:
        name = self.node_name(short)
        meta = client.V1ObjectMeta(name=name, labels={"kubernetes.io/hostname": f"{name}.example", **labels})
        self.core.create_node(client.V1Node(metadata=meta))
        self.nodes.append(name)
        if ip is not None:
            self.set_address(name, ip)
        return name

    def set_address(self, node: str, ip: str) -> None:
        addresses = [{"type": "InternalIP", "address": "fd00::9"}, {"type": "InternalIP", "address": ip}]
        self.core.patch_node_status(node, {"status": {"addresses": addresses}})

    def set_labels(self, node: str, labels: dict[str, str | None]) -> None:
        self.core.patch_node(node, {"metadata": {"labels": labels}})

    def create(self, kind: str, name: str, spec: Obj) -> Obj:
        resource = NODE_CONFIG if kind == NODE_CONFIG.kind else NODE_CONFIG_TEMPLATE
        body = {"apiVersion": resource.api_version, "kind": kind, "metadata": {"name": name}, "spec": spec}
        created: Obj = self.objects.create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, resource.plural, body
        )
        return created

    def node_configs(self) -> dict[str, Obj]:
        items = self.objects.list_namespaced_custom_object(GROUP, VERSION, self.namespace, NODE_CONFIG.plural)
        return {i["metadata"]["name"]: i for i in items["items"]}

    def template(self, name: str) -> Obj:
        got: Obj = self.objects.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, NODE_CONFIG_TEMPLATE.plural, name
        )
        return got

    def ready(self, name: str) -> tuple[str, str, str] | None:
        for c in self.template(name).get("status", {}).get("conditions") or ():
            if c["type"] == "Ready":
                return c["status"], c["reason"], c["message"]
        return None

    def events(self, name: str) -> list[tuple[str, str, str]]:
        events = self.core.list_namespaced_event(self.namespace, field_selector=f"involvedObject.name={name}")
        return [(e.type, e.reason, e.message or "") for e in events.items]

    def wait(
        self, predicate: Callable[[], _T | None], what: Callable[[], str] | str, timeout: float = WAIT
    ) -> _T:
        return self.operator.wait_for(predicate, what, timeout, 0.2)

    def wait_configs(self, names: set[str]) -> dict[str, Obj]:
        """The namespace's NodeConfigs, once they are exactly `names`."""

        def check() -> tuple[dict[str, Obj]] | None:
            configs = self.node_configs()
            return (configs,) if set(configs) == names else None

        (configs,) = self.wait(
            check, lambda: f"NodeConfigs {sorted(names)}; have {sorted(self.node_configs())}"
        )
        return configs

    def wait_ready(self, name: str, status: str, reason: str) -> str:
        def check() -> str | None:
            got = self.ready(name)
            return got[2] if got is not None and got[:2] == (status, reason) else None

        return self.wait(check, lambda: f"{name} Ready={status} ({reason}); now {self.ready(name)}")

    def wait_event(self, name: str, reason: str, contains: str = "") -> tuple[str, str, str]:
        return self.wait(
            lambda: next((e for e in self.events(name) if e[1] == reason and contains in e[2]), None),
            lambda: f"Event {reason} ({contains!r}) on {name}; have {self.events(name)}",
        )


@pytest.fixture
def env(control_plane: ControlPlane, namespace: str, tmp_path: Path) -> Iterator[Env]:
    with control_plane.api_client() as api:
        operator = Operator(control_plane, namespace, tmp_path / "operator.log")
        e = Env(api, namespace, uuid.uuid4().hex[:6], operator, [])
        try:
            operator.wait_alive()
            yield e
        finally:
            operator.stop()
            for node in e.nodes:
                with contextlib.suppress(ApiException):
                    e.core.delete_node(node)


def template_spec(selector: Obj | None = None, **deltap: str) -> Obj:
    return {
        "nodeSelector": selector if selector is not None else {"matchLabels": REDFISH},
        "template": {
            "metricsCollector": {
                "inletTemp": {
                    "type": "Redfish",
                    "endpoint": "https://10.0.100.{{.IPv4.Octet4}}",
                    "basicAuthSecret": {"name": "redfish-basicauth-{{.Hostname}}"},
                    "fetchInterval": "10s",
                },
                "deltaP": {
                    "type": "DifferentialPressureAPI",
                    "endpoint": "http://{{.IPv4.Address}}:5000",
                    **deltap,
                },
            },
            "predictor": {"powerConsumption": {"type": "Fake"}},
        },
    }


# --- tests -------------------------------------------------------------------------------------------------


def test_template_follows_the_nodes_both_ways(env: Env) -> None:
    n1 = env.add_node("n1", REDFISH, "10.0.0.11")
    n2 = env.add_node("n2", {}, "10.0.0.12")
    template = env.create("NodeConfigTemplate", "redfish", template_spec())

    configs = env.wait_configs({f"redfish-{n1}"})
    config = configs[f"redfish-{n1}"]
    assert config["spec"] == {
        "nodeName": n1,
        "metricsCollector": {
            "inletTemp": {
                "type": "Redfish",
                "endpoint": "https://10.0.100.11",  # its IPv4 InternalIP, though an IPv6 one is listed first
                "basicAuthSecret": {"name": f"redfish-basicauth-{n1}.example"},
                "fetchInterval": "10s",
            },
            "deltaP": {"type": "DifferentialPressureAPI", "endpoint": "http://10.0.0.11:5000"},
        },
        "predictor": {"powerConsumption": {"type": "Fake"}},
    }
    (owner,) = config["metadata"]["ownerReferences"]
    assert owner["uid"] == template["metadata"]["uid"] and owner["controller"] is True
    assert owner["kind"] == "NodeConfigTemplate" and owner["name"] == "redfish"
    env.wait_ready("redfish", "True", "Synced")
    env.wait_event("redfish", "NodeConfigCreated", f"redfish-{n1} for node {n1}")
    # Of the template the operator writes the status only: no finalizer, no kopf annotations.
    meta = env.template("redfish")["metadata"]
    assert not meta.get("finalizers")
    assert not any("kopf" in k or "rmd-operator" in k for k in meta.get("annotations") or {})

    # A label added: the node gets its NodeConfig, rendered with its own data.
    env.set_labels(n2, REDFISH)
    configs = env.wait_configs({f"redfish-{n1}", f"redfish-{n2}"})
    assert (
        configs[f"redfish-{n2}"]["spec"]["metricsCollector"]["inletTemp"]["endpoint"] == "https://10.0.100.12"
    )
    # The node's address changes: so does its NodeConfig.
    env.set_address(n2, "10.0.0.22")
    env.wait(
        lambda: (
            env.node_configs()[f"redfish-{n2}"]["spec"]["metricsCollector"]["deltaP"]["endpoint"]
            == "http://10.0.0.22:5000"
        ),
        "the NodeConfig of n2 to follow its new address",
    )

    # The label removed, and a node deleted: their NodeConfigs go (wao-core left them behind).
    env.set_labels(n1, {INSTANCE_TYPE: None})
    env.wait_configs({f"redfish-{n2}"})
    env.wait_event("redfish", "NodeConfigDeleted", f"node {n1} no longer matches the nodeSelector")
    env.core.delete_node(n2)
    env.wait_configs(set())
    env.wait_event("redfish", "NodeConfigDeleted", f"node {n2} is gone")
    status = env.template("redfish")["status"]
    assert (status["matchingNodes"], status["nodeConfigs"], status["problems"]) == (0, 0, [])

    # The template deleted: the garbage collector removes what it owns.
    env.set_labels(n1, REDFISH)
    env.wait_configs({f"redfish-{n1}"})
    env.objects.delete_namespaced_custom_object(
        GROUP, VERSION, env.namespace, NODE_CONFIG_TEMPLATE.plural, "redfish"
    )
    env.wait(lambda: env.node_configs() == {}, "the garbage collector to remove the NodeConfig", timeout=90)


def test_template_errors_and_conflicts_are_reported(env: Env) -> None:
    nameless = env.add_node("noip", REDFISH, None)
    first = env.create("NodeConfigTemplate", "first", template_spec())

    # No IPv4 InternalIP for {{.IPv4.Octet4}}: reported, nothing written (wao-core wrote https://x.x.x.x).
    message = env.wait_ready("first", "False", "TemplateError")
    assert f"{nameless} (TemplateError)" in message and "no IPv4 InternalIP address" in message
    (problem,) = env.template("first")["status"]["problems"]
    assert problem["node"] == nameless and problem["reason"] == "TemplateError"
    assert "metricsCollector.inletTemp.endpoint" in problem["message"]
    warning = env.wait_event("first", "TemplateError", nameless)
    assert warning[0] == "Warning"
    assert env.node_configs() == {}

    # The node gets an address: the NodeConfig appears, the problem goes.
    env.set_address(nameless, "10.0.0.31")
    env.wait_configs({f"first-{nameless}"})
    env.wait_ready("first", "True", "Synced")

    # A second template selecting the same node: a Conflict, reported on the newcomer; the node keeps one.
    env.create(
        "NodeConfigTemplate",
        "second",
        template_spec({"matchExpressions": [{"key": INSTANCE_TYPE, "operator": "Exists"}]}),
    )
    message = env.wait_ready("second", "False", "Conflict")
    assert f"also selected by NodeConfigTemplate {env.namespace}/first" in message
    assert env.wait_event("second", "Conflict", nameless)[0] == "Warning"
    assert set(env.node_configs()) == {f"first-{nameless}"}
    assert env.ready("first") is not None and env.ready("first")[:2] == ("True", "Synced")  # type: ignore[index]

    # A hand-written NodeConfig for a node: every template selecting it yields.
    by_hand = env.add_node("byhand", REDFISH, "10.0.0.32")
    env.create(
        "NodeConfig",
        "written-by-hand",
        {
            "nodeName": by_hand,
            "metricsCollector": {"inletTemp": {"type": "Fake"}, "deltaP": {"type": "Fake"}},
        },
    )
    env.wait(
        lambda: any(p["node"] == by_hand for p in env.template("first")["status"]["problems"]),
        "first's Conflict for the node with a hand-written NodeConfig",
    )
    assert set(env.node_configs()) == {f"first-{nameless}", "written-by-hand"}
    assert first["metadata"]["uid"]

    # A rendering the NodeConfig's schema refuses ({{.Hostname}} as a type): the API server's words.
    env.create(
        "NodeConfigTemplate", "odd", template_spec({"matchLabels": {"pool": "odd"}}, type="{{.Hostname}}")
    )
    odd = env.add_node("odd", {"pool": "odd"}, "10.0.0.33")
    message = env.wait_ready("odd", "False", "Invalid")
    assert f"the API server refused NodeConfig odd-{odd}" in message
    assert "spec.metricsCollector.deltaP.type" in message and "supported values" in message
    env.wait_event("odd", "Invalid", "spec.metricsCollector.deltaP.type")
