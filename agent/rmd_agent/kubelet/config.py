"""Read the kubelet's KubeletConfiguration file (`--config`, /var/lib/kubelet/config.yaml with kubeadm).

Only the file is visible to the agent. Command-line flags, which override it, and drop-in files
(`--config-dir`) are not, so these values are what the file asks for, not a guarantee of what runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import yaml

from rmd_agent.errors import HostReadError, Unsupported
from rmd_agent.hostfs import HostFS
from rmd_api.cpuset import CpuListError, parse_cpu_list
from rmd_api.yaml_errors import YAML_ERRORS

DEFAULT_CONFIG_PATH = "var/lib/kubelet/config.yaml"
_KIND = "KubeletConfiguration"
_GROUP = "kubelet.config.k8s.io"


@dataclass(frozen=True)
class KubeletConfig:
    """The settings the agent needs, with the kubelet's defaults for fields the file leaves out.

    `cgroup_driver` is only what the file says (kubelet default "cgroupfs"); newer kubelets may take the
    driver from the container runtime, so the host's cgroup tree (observe/cgroups.py) is the better evidence.
    """

    cpu_manager_policy: str = "none"
    topology_manager_policy: str = "none"
    topology_manager_scope: str = "container"
    reserved_system_cpus: frozenset[int] = frozenset()
    cgroup_driver: str = "cgroupfs"
    memory_manager_policy: str = "None"
    source: str = ""


# KubeletConfiguration field -> KubeletConfig attribute, for the plain string settings.
_STRING_FIELDS = {
    "cpuManagerPolicy": "cpu_manager_policy",
    "topologyManagerPolicy": "topology_manager_policy",
    "topologyManagerScope": "topology_manager_scope",
    "cgroupDriver": "cgroup_driver",
    "memoryManagerPolicy": "memory_manager_policy",
}


def read_kubelet_config(fs: HostFS, path: str = DEFAULT_CONFIG_PATH) -> KubeletConfig | Unsupported:
    """The kubelet config at `path` (relative to the host root); Unsupported if it is missing or is not
    a KubeletConfiguration. HostReadError if it exists but cannot be read (e.g. permissions)."""
    shown = "/" + path.lstrip("/")
    try:
        text = fs.read_text(path)
    except HostReadError as exc:
        if isinstance(exc.__cause__, UnicodeDecodeError):
            return Unsupported(f"{shown}: not UTF-8 text, so not a kubelet config")
        if not fs.exists(path):
            return Unsupported(
                f"{shown} does not exist (kubelet not on this node, configured by flags only, "
                "or started with another --config)"
            )
        raise
    return parse_kubelet_config(text, shown)


def parse_kubelet_config(text: str, source: str) -> KubeletConfig | Unsupported:
    """Parse KubeletConfiguration YAML; Unsupported with the reason if it is not one."""
    try:
        document = yaml.safe_load(text)
    except YAML_ERRORS as exc:
        return Unsupported(f"{source}: not valid YAML: {_yaml_problem(exc)}")
    if not isinstance(document, Mapping):
        return Unsupported(f"{source}: expected a YAML mapping, found {_yaml_kind(document)}")
    kind, api_version = document.get("kind"), document.get("apiVersion")
    if kind != _KIND:
        return Unsupported(f"{source}: kind is {kind!r}, expected {_KIND!r}")
    if not isinstance(api_version, str) or not api_version.startswith(f"{_GROUP}/"):
        return Unsupported(f"{source}: apiVersion is {api_version!r}, expected {_GROUP}/<version>")

    values: dict[str, str] = {}
    for name, attribute in _STRING_FIELDS.items():
        value = document.get(name)
        if value is None or value == "":  # the kubelet's defaulting fills in empty values too
            continue
        if not isinstance(value, str):
            return Unsupported(f"{source}: {name} is {_yaml_kind(value)}, expected a string")
        values[attribute] = value

    reserved = _reserved_cpus(document.get("reservedSystemCPUs"))
    if isinstance(reserved, str):
        return Unsupported(f"{source}: reservedSystemCPUs {reserved}")
    return KubeletConfig(reserved_system_cpus=reserved, source=source, **values)


def _reserved_cpus(value: object) -> frozenset[int] | str:
    """The reserved CPUs, or the problem with the value as a string."""
    if value is None:
        return frozenset()
    # An unquoted single CPU (`reservedSystemCPUs: 0`) is a YAML integer. The kubelet's strict decoder
    # refuses it, but the intent is clear and refusing the whole file would hide the other settings.
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        return f'is {_yaml_kind(value)}, expected a cpu list string such as "0-1"'
    try:
        return parse_cpu_list(value)
    except CpuListError as exc:
        return f"is not a cpu list: {exc}"


def _yaml_kind(value: object) -> str:
    if value is None:
        return "empty"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, Mapping):
        return "a mapping"
    return type(value).__name__


def _yaml_problem(exc: Exception) -> str:
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or next(iter(str(exc).splitlines()), "") or type(exc).__name__
    return f"{problem} at line {mark.line + 1}" if mark is not None else str(problem)
