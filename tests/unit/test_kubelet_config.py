"""Reading KubeletConfiguration: the values the agent uses, the kubelet's defaults, and refusals."""

from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from rmd_agent.errors import Unsupported
from rmd_agent.hostfs import HostFS
from rmd_agent.kubelet.config import KubeletConfig, read_kubelet_config

MakeTree = Callable[[Mapping[str, str]], Path]
CONFIG = "var/lib/kubelet/config.yaml"
HEADER = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"


def _read(make_tree: MakeTree, text: str) -> KubeletConfig | Unsupported:
    return read_kubelet_config(HostFS(make_tree({CONFIG: text})))


def test_reads_the_topology_settings(make_tree: MakeTree) -> None:
    config = _read(
        make_tree,
        HEADER
        + "cpuManagerPolicy: static\ntopologyManagerPolicy: single-numa-node\ntopologyManagerScope: pod\n"
        'reservedSystemCPUs: "0-1,8"\ncgroupDriver: cgroupfs\nmemoryManagerPolicy: Static\n'
        "evictionHard: {memory.available: 100Mi}\n",
    )
    assert config == KubeletConfig(
        cpu_manager_policy="static",
        topology_manager_policy="single-numa-node",
        topology_manager_scope="pod",
        reserved_system_cpus=frozenset({0, 1, 8}),
        cgroup_driver="cgroupfs",
        memory_manager_policy="Static",
        source="/var/lib/kubelet/config.yaml",
    )


def test_fields_left_out_null_or_empty_take_the_defaults(make_tree: MakeTree) -> None:
    config = _read(make_tree, HEADER + "cpuManagerPolicy:\ntopologyManagerPolicy: ''\n")
    assert config == KubeletConfig(source="/var/lib/kubelet/config.yaml")
    assert isinstance(config, KubeletConfig)
    assert (config.cpu_manager_policy, config.topology_manager_policy, config.topology_manager_scope) == (
        "none",
        "none",
        "container",
    )
    assert (config.reserved_system_cpus, config.memory_manager_policy) == (frozenset(), "None")


def test_an_unquoted_single_reserved_cpu_is_read(make_tree: MakeTree) -> None:
    config = _read(make_tree, HEADER + "reservedSystemCPUs: 3\n")
    assert isinstance(config, KubeletConfig)
    assert config.reserved_system_cpus == {3}


def test_path_is_configurable(make_tree: MakeTree) -> None:
    root = make_tree({"etc/kubernetes/kubelet.yaml": HEADER + "cpuManagerPolicy: static\n"})
    config = read_kubelet_config(HostFS(root), "/etc/kubernetes/kubelet.yaml")
    assert isinstance(config, KubeletConfig)
    assert (config.cpu_manager_policy, config.source) == ("static", "/etc/kubernetes/kubelet.yaml")


def test_missing_file_is_unsupported(make_tree: MakeTree) -> None:
    config = read_kubelet_config(HostFS(make_tree({})))
    assert isinstance(config, Unsupported)
    assert config.reason.startswith("/var/lib/kubelet/config.yaml does not exist")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (HEADER + "cpuManagerPolicy: [static\n", "not valid YAML: "),
        ("- a\n- b\n", "expected a YAML mapping, found a list"),
        ("", "expected a YAML mapping, found empty"),
        ("apiVersion: kubelet.config.k8s.io/v1beta1\n", "kind is None, expected 'KubeletConfiguration'"),
        ("apiVersion: v1\nkind: ConfigMap\n", "kind is 'ConfigMap'"),
        (
            "apiVersion: kubeadm.k8s.io/v1beta4\nkind: KubeletConfiguration\n",
            "apiVersion is 'kubeadm.k8s.io/v1beta4'",
        ),
        (HEADER + "cpuManagerPolicy: 5\n", "cpuManagerPolicy is a number, expected a string"),
        (HEADER + "topologyManagerScope: {a: b}\n", "topologyManagerScope is a mapping"),
        (HEADER + "reservedSystemCPUs: [0, 1]\n", "reservedSystemCPUs is a list"),
        (HEADER + "reservedSystemCPUs: 3-1\n", "reservedSystemCPUs is not a cpu list"),
    ],
)
def test_malformed_configs_are_unsupported_with_the_reason(
    make_tree: MakeTree, text: str, reason: str
) -> None:
    config = _read(make_tree, text)
    assert isinstance(config, Unsupported)
    assert config.reason.startswith("/var/lib/kubelet/config.yaml: ")
    assert reason in config.reason


def test_yaml_errors_name_the_line(make_tree: MakeTree) -> None:
    config = _read(make_tree, HEADER + "cpuManagerPolicy: static\n  bad: indent\n")
    assert isinstance(config, Unsupported)
    assert "at line 4" in config.reason


def test_a_config_that_is_not_text_is_unsupported(make_tree: MakeTree) -> None:
    root = make_tree({})
    (root / "var/lib/kubelet").mkdir(parents=True)
    (root / CONFIG).write_bytes(b"kind: \xff\n")
    config = read_kubelet_config(HostFS(root))
    assert isinstance(config, Unsupported)
    assert "not UTF-8 text" in config.reason
