"""What the real node's components are configured with (rmd_sim.realnode.node; reference: real-kubelet.md):
containerd's config.toml, the CNI bridge network of the pods, and the KubeletConfiguration. Pure: the node
writes them where they belong."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

CNI_BIN_DIR = Path("/usr/lib/cni")
POD_SUBNET = "10.249.0.0/24"  # inside the node's own network namespace only
BRIDGE = "rmdbr0"


def containerd_config(base: Path, address: str, sandbox_image: str, cni_conf_dir: Path) -> str:
    """containerd's config.toml: root and state under `base`, serving on `address`, the CRI plugin with runc
    (cgroupfs) and the CNI configuration in `cni_conf_dir`."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{base / "root"}"
state = "{base / "state"}"
# Plugins that would write outside this directory or are of no use here.
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "{address}"
[ttrpc]
  address = "{address}.ttrpc"

[{cri}]
  sandbox_image = "{sandbox_image}"
  # runc cannot lower oom_score_adj here (no CAP_SYS_RESOURCE in the bounding set): every sandbox would fail.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
  [{cri}.cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{cni_conf_dir}"
"""


def cni_conflist(ipam_dir: Path) -> dict[str, Any]:
    """The pods' network: a bridge with the gateway on it, addresses from POD_SUBNET, no masquerading (the
    node's namespace does that for the whole subnet)."""
    return {
        "cniVersion": "1.0.0",
        "name": "rmd-realnode",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_SUBNET}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(ipam_dir),
                },
            }
        ],
    }


def kubelet_configuration(
    *,
    address: str,
    client_ca_file: Path,
    containerd_address: str,
    system_reserved_cpu: str,
    pod_logs_dir: Path,
    feature_gates: Mapping[str, bool],
) -> dict[str, Any]:
    """The KubeletConfiguration of the real node (reference: real-kubelet.md, "Kubelet configuration")."""
    config: dict[str, Any] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": address,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(client_ca_file)},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{containerd_address}",
        "cgroupDriver": "cgroupfs",
        "cgroupsPerQOS": True,
        "enforceNodeAllocatable": ["pods"],
        "failCgroupV1": False,  # these machines run cgroup v1; kubelets since 1.35 refuse it otherwise
        "failSwapOn": False,
        "oomScoreAdj": 0,  # the default -999 cannot be set here
        "cpuManagerPolicy": "static",
        # The static policy reserves whole CPUs, the lowest-numbered first: 100m reserves CPU 0 for the
        # shared pool and leaves CPU 1 for exclusive use. (reservedSystemCPUs: "0" reserves the same CPU
        # but takes a whole CPU from the node's allocatable too: on 2 CPUs a 1-CPU pod would not fit
        # beside the chart's own pods.)
        "systemReserved": {"cpu": system_reserved_cpu},
        "topologyManagerPolicy": "single-numa-node",
        "topologyManagerScope": "container",
        "resolvConf": "/etc/resolv.conf",
        "podLogsDir": str(pod_logs_dir),
        # A shared build machine: never evict test pods for disk or memory pressure, never collect images.
        "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "clusterDomain": "cluster.local",
    }
    if feature_gates:
        config["featureGates"] = dict(feature_gates)
    return config
