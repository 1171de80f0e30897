"""rmd_agent.kube: the agent's Kubernetes client configuration and its merge-patch diff (no API server)."""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from rmd_agent.errors import ConfigError
from rmd_agent.kube import api_client_factory, create_api_client, merge_patch
from rmd_agent.settings import AgentSettings

# -- merge_patch ---------------------------------------------------------------------------------------------


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 MergePatch, written from the RFC's pseudo-code, to check diffs against."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = apply_merge_patch(result.get(key), value)
    return result


def test_equal_documents_need_no_patch() -> None:
    doc = {"a": {"b": [1, 2]}, "c": "x"}
    assert merge_patch(doc, copy.deepcopy(doc)) == {}


def test_removed_keys_become_null_and_lists_are_replaced() -> None:
    current = {"workloads": {"a": {"ID": "1"}, "b": {"ID": "2", "Cos Name": "COS1"}}, "conditions": [1, 2]}
    desired = {"workloads": {"b": {"ID": "2"}}, "conditions": [2]}
    assert merge_patch(current, desired) == {
        "workloads": {"a": None, "b": {"Cos Name": None}},
        "conditions": [2],
    }


def test_a_new_empty_map_is_sent() -> None:
    assert merge_patch({}, {"workloads": {}}) == {"workloads": {}}
    assert merge_patch({"workloads": "odd"}, {"workloads": {}}) == {"workloads": {}}


# Desired documents hold no nulls inside mappings (merge patch cannot express a null value). Drawn without
# nulls rather than filtered: a filter failed Hypothesis's health check now and then.
non_null_scalars = st.booleans() | st.integers() | st.text(max_size=3)
values = st.recursive(
    non_null_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from("abcd"), inner, max_size=4),
    max_leaves=12,
)
documents = st.dictionaries(st.sampled_from("abcde"), values, max_size=5)


@given(documents, documents)
def test_the_patch_turns_current_into_desired(current: dict[str, Any], desired: dict[str, Any]) -> None:
    patch = merge_patch(current, desired)
    assert apply_merge_patch(current, patch) == desired
    assert (patch == {}) == (current == desired)


# -- create_api_client ---------------------------------------------------------------------------------------


def write_kubeconfig(
    path: Path, server: str = "https://127.0.0.1:6443", proxy_url: str | None = None
) -> Path:
    cluster: dict[str, Any] = {
        "server": server,
        "certificate-authority-data": base64.b64encode(b"not a real CA").decode(),
    }
    if proxy_url:
        cluster["proxy-url"] = proxy_url
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": cluster}],
                "users": [{"name": "u", "user": {"token": "t0ken"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    return path


def test_kubeconfig_file_is_used_and_no_proxy_comes_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, "http://proxy.invalid:3128")
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", server="https://10.9.8.7:6443")
    with create_api_client(AgentSettings(kubeconfig=str(kubeconfig))) as api:
        assert api.configuration.host == "https://10.9.8.7:6443"
        assert api.configuration.proxy is None


def test_a_proxy_named_in_the_kubeconfig_is_honoured(tmp_path: Path) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", proxy_url="http://explicit.invalid:3128")
    factory = api_client_factory(AgentSettings(kubeconfig=str(kubeconfig)))
    with factory() as api:
        assert api.configuration.proxy == "http://explicit.invalid:3128"


def test_missing_kubeconfig_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="kubeconfig"):
        create_api_client(AgentSettings(kubeconfig=str(tmp_path / "absent")))


def test_outside_a_pod_in_cluster_config_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    with pytest.raises(ConfigError, match="in-cluster"):
        create_api_client(AgentSettings())
