"""rmd_agent.kube, kube_config and kube_api: the agent's Kubernetes client configuration (in-cluster and
kubeconfig), its token re-reading and errors, and its merge-patch diff (no API server; requests over real
sockets are in tests/component/test_kube_api.py)."""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from rmd_agent.errors import ConfigError, KubeApiError, KubeConnectionError
from rmd_agent.kube import create_api_client, merge_patch
from rmd_agent.kube_api import TokenFile
from rmd_agent.kube_config import load_in_cluster, load_kubeconfig
from rmd_agent.settings import AgentSettings
from rmd_sim.pki import CertificateAuthority

Obj = dict[str, Any]

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


# -- create_api_client and its configuration -----------------------------------------------------------------

CA = CertificateAuthority("test-cluster-ca")
CLIENT = CA.issue_client("rmd-agent")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def kubeconfig_doc(
    server: str = "https://127.0.0.1:6443", cluster: Obj | None = None, user: Obj | None = None
) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "c",
                "cluster": {
                    "server": server,
                    "certificate-authority-data": b64(CA.cert_pem),
                    **(cluster or {}),
                },
            }
        ],
        "users": [{"name": "u", "user": {"token": "t0ken"} if user is None else user}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    }


def write_kubeconfig(path: Path, doc: Obj | None = None, **options: Any) -> Path:
    path.write_text(yaml.safe_dump(doc if doc is not None else kubeconfig_doc(**options)))
    return path


def test_a_kubeconfig_gives_server_ca_client_certificate_and_token(tmp_path: Path) -> None:
    user = {
        "client-certificate-data": b64(CLIENT.cert_pem),
        "client-key-data": b64(CLIENT.key_pem),
        "token": "t",
    }
    config = load_kubeconfig(write_kubeconfig(tmp_path / "kc", server="https://10.9.8.7:6443", user=user))
    assert (config.server, config.ca_pem, config.token, config.token_file) == (
        "https://10.9.8.7:6443",
        CA.cert_pem,
        "t",
        None,
    )
    assert (config.client_cert_pem, config.client_key_pem) == (CLIENT.cert_pem, CLIENT.key_pem)
    assert config.proxy_url is None and config.headers == ()
    with create_api_client(AgentSettings(kubeconfig=str(tmp_path / "kc"))) as api:
        assert api.server == "https://10.9.8.7:6443"


def test_files_named_in_a_kubeconfig_are_relative_to_its_directory(tmp_path: Path) -> None:
    (tmp_path / "pki").mkdir()
    for name, data in {"ca.crt": CA.cert_pem, "me.crt": CLIENT.cert_pem, "me.key": CLIENT.key_pem}.items():
        (tmp_path / "pki" / name).write_bytes(data)
    (tmp_path / "pki" / "token").write_text("from-a-file\n")
    doc = kubeconfig_doc(
        user={"client-certificate": "pki/me.crt", "client-key": "pki/me.key", "tokenFile": "pki/token"}
    )
    doc["clusters"][0]["cluster"] = {"server": "https://h:1", "certificate-authority": "pki/ca.crt"}
    config = load_kubeconfig(write_kubeconfig(tmp_path / "kc", doc))
    assert (config.ca_pem, config.client_cert_pem, config.client_key_pem) == (
        CA.cert_pem,
        CLIENT.cert_pem,
        CLIENT.key_pem,
    )
    assert (config.token, config.token_file) == ("from-a-file", tmp_path / "pki" / "token")


def test_the_current_context_or_the_only_one_is_used(tmp_path: Path) -> None:
    doc = kubeconfig_doc()
    doc["clusters"].append({"name": "other", "cluster": {"server": "https://other:6443"}})
    doc["contexts"].append({"name": "o", "context": {"cluster": "other"}})  # no user: anonymous
    doc["current-context"] = "o"
    config = load_kubeconfig(write_kubeconfig(tmp_path / "kc", doc))
    assert (config.server, config.ca_pem, config.token) == ("https://other:6443", None, None)
    del doc["current-context"]
    with pytest.raises(ConfigError, match="no current-context, and 2 contexts"):
        load_kubeconfig(write_kubeconfig(tmp_path / "kc", doc))
    doc["contexts"].pop()
    assert load_kubeconfig(write_kubeconfig(tmp_path / "kc", doc)).server == "https://127.0.0.1:6443"


def test_impersonation_in_a_kubeconfig_becomes_headers(tmp_path: Path) -> None:
    user = {
        "token": "t",
        "as": "system:serviceaccount:ns:sa",
        "as-uid": "1234",
        "as-groups": ["g1", "g2"],
        "as-user-extra": {"authentication.kubernetes.io/node-name": ["node-a"]},
    }
    config = load_kubeconfig(write_kubeconfig(tmp_path / "kc", user=user))
    assert config.headers == (
        ("Impersonate-User", "system:serviceaccount:ns:sa"),
        ("Impersonate-Uid", "1234"),
        ("Impersonate-Group", "g1"),
        ("Impersonate-Group", "g2"),
        ("Impersonate-Extra-authentication.kubernetes.io%2Fnode-name", "node-a"),
    )


def test_a_tls_server_name_in_the_kubeconfig_is_kept(tmp_path: Path) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kc", cluster={"tls-server-name": "api.test"})
    assert load_kubeconfig(kubeconfig).tls_server_name == "api.test"
    assert load_kubeconfig(write_kubeconfig(tmp_path / "kc")).tls_server_name is None


def test_a_proxy_named_in_the_kubeconfig_is_kept(tmp_path: Path) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kc", cluster={"proxy-url": "http://explicit.invalid:3128"})
    assert load_kubeconfig(kubeconfig).proxy_url == "http://explicit.invalid:3128"


@pytest.mark.parametrize(
    ("cluster", "user", "named"),
    [
        ({}, {"exec": {"command": "aws"}}, "user 'u' uses exec (a credential plugin)"),
        ({}, {"auth-provider": {"name": "oidc"}}, "user 'u' uses auth-provider (a credential plugin)"),
        ({}, {"username": "a", "password": "b"}, "uses username (basic auth)"),
        ({"insecure-skip-tls-verify": True}, None, "insecure-skip-tls-verify is not supported"),
        (
            {"proxy-url": "socks5://p:1080"},
            None,
            "proxy-url 'socks5://p:1080' is not an http:// or https:// URL",
        ),
        ({"server": "http://127.0.0.1:8080"}, None, "server 'http://127.0.0.1:8080' is not an https:// URL"),
        ({"certificate-authority-data": "not base64!"}, None, "certificate-authority-data is not base64"),
        (
            {},
            {"client-certificate-data": b64(CLIENT.cert_pem)},
            "client-certificate and client-key go together",
        ),
        ({}, {"tokenFile": "absent"}, "absent: No such file or directory"),
    ],
)
def test_what_the_agent_cannot_do_is_refused_by_name(
    tmp_path: Path, cluster: Obj, user: Obj | None, named: str
) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kc", cluster=cluster, user=user)
    with pytest.raises(ConfigError) as refused:
        create_api_client(AgentSettings(kubeconfig=str(kubeconfig)))
    assert str(refused.value).startswith(
        f"cannot configure the Kubernetes client from the kubeconfig {kubeconfig}: "
    )
    assert named in str(refused.value)


def test_a_ca_that_is_no_certificate_is_a_config_error(tmp_path: Path) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kc", cluster={"certificate-authority-data": b64(b"not a CA")})
    with pytest.raises(ConfigError, match=r"kubeconfig .*certificate authority is not a PEM certificate"):
        create_api_client(AgentSettings(kubeconfig=str(kubeconfig)))


def test_a_client_key_that_does_not_match_is_a_config_error(tmp_path: Path) -> None:
    other = CA.issue_client("someone-else")
    user = {"client-certificate-data": b64(CLIENT.cert_pem), "client-key-data": b64(other.key_pem)}
    with pytest.raises(ConfigError, match="client certificate and key cannot be loaded"):
        create_api_client(AgentSettings(kubeconfig=str(write_kubeconfig(tmp_path / "kc", user=user))))


def test_missing_kubeconfig_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="kubeconfig"):
        create_api_client(AgentSettings(kubeconfig=str(tmp_path / "absent")))


def test_outside_a_pod_in_cluster_config_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    with pytest.raises(ConfigError, match="in-cluster"):
        create_api_client(AgentSettings())


def service_account(root: Path, token: str = "sa-token") -> Path:
    root.mkdir()
    (root / "token").write_text(token)
    (root / "ca.crt").write_bytes(CA.cert_pem)
    return root


@pytest.mark.parametrize(
    ("host", "server"),
    [("10.96.0.1", "https://10.96.0.1:443"), ("fd00:10:96::1", "https://[fd00:10:96::1]:443")],
)
def test_in_cluster_config_is_the_service_account(tmp_path: Path, host: str, server: str) -> None:
    env = {"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": "443"}
    config = load_in_cluster(env, service_account(tmp_path / "sa"))
    assert (config.server, config.ca_pem, config.token) == (server, CA.cert_pem, "sa-token")
    assert config.token_file == tmp_path / "sa" / "token"
    assert config.proxy_url is None and config.client_cert_pem is None


@pytest.mark.parametrize("missing", ["token", "ca.crt"])
def test_in_cluster_without_the_mounted_token_or_ca_is_a_config_error(tmp_path: Path, missing: str) -> None:
    account = service_account(tmp_path / "sa")
    (account / missing).unlink()
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    with pytest.raises(ConfigError, match=f"in-cluster config: cannot read {account / missing}"):
        load_in_cluster(env, account)


def test_the_token_file_is_read_again_each_period_and_a_failed_reading_keeps_the_token(
    tmp_path: Path,
) -> None:
    path = tmp_path / "token"
    path.write_text("one")
    now = [0.0]
    tokens = TokenFile(path, "one", period=60.0, clock=lambda: now[0])
    path.write_text("two")
    assert tokens.token() == "one"  # not read again within the period
    now[0] = 60.0
    assert tokens.token() == "two"
    path.unlink()
    now[0] = 120.0
    assert tokens.token() == "two"
    path.write_text("three")
    now[0] = 150.0
    assert tokens.token() == "two"  # the failed reading started a new period
    now[0] = 180.0
    assert tokens.token() == "three"


def test_api_errors_carry_the_answer() -> None:
    body = '{"kind": "Status", "message": "rmdnodestates \\"x\\" already exists", "code": 409}'
    exc = KubeApiError(409, "Conflict", body)
    assert (exc.status, exc.reason, exc.body) == (409, "Conflict", body)
    assert str(exc) == '409 Conflict: rmdnodestates "x" already exists'
    assert str(KubeApiError(503, "Service Unavailable", "not json")) == "503 Service Unavailable"
    unreachable = KubeConnectionError("GET https://h:1/api: no answer: refused")
    assert isinstance(unreachable, KubeApiError)
    assert (unreachable.status, str(unreachable)) == (0, "GET https://h:1/api: no answer: refused")
