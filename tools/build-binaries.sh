#!/usr/bin/env bash
# Build the test control plane (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, etcd), the kubelet
# of the real-node tier and helm from
# the Go module proxy into a cache directory outside the repository, keyed by what determines the
# binaries. A second run with the same key only checks the cache and returns in well under a second.
#
#   tools/build-binaries.sh            build what is missing, print the binary directory last
#   tools/build-binaries.sh --print    print the binary directory, build nothing (exit 1 if incomplete)
#
# Environment: RMD_BIN_CACHE (default ${XDG_CACHE_HOME:-~/.cache}/rmd-k8s), GOPROXY as set up on the machine.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
K8S_VERSION=v1.36.3
LEGACY_KUBELET_VERSION=v1.33.13  # a kubelet from before PodResources Get was on by default (real-node tier)
ETCD_VERSION=v3.6.8
HELM_VERSION=v3.21.4

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod

cache_root=${RMD_BIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rmd-k8s}
key=$( { go version; cat "$here"/k8s/go.{mod,sum} "$here"/kubelet-1.33/go.{mod,sum} "$here"/etcd/go.{mod,sum} \
         "$here"/helm/go.{mod,sum} "$0"; } \
       | sha256sum | cut -c1-12)
bin_dir="$cache_root/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-helm-$HELM_VERSION-$key"
binaries=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kubelet-1.33 etcd helm)

complete() {
  for b in "${binaries[@]}"; do [ -x "$bin_dir/$b" ] || return 1; done
}

if [ "${1:-}" = "--print" ]; then
  complete || { echo "binaries not built yet: run tools/build-binaries.sh" >&2; exit 1; }
  echo "$bin_dir"; exit 0
fi
if complete; then
  echo "control-plane binaries: cached in $bin_dir" >&2
  echo "$bin_dir"; exit 0
fi

mkdir -p "$bin_dir.partial"
start=$(date +%s)
step() { echo "[build-binaries $(( $(date +%s) - start ))s] $*" >&2; }

# `go build -v` names each package as it is compiled; print a running count instead of thousands of lines.
# Those lines are bare import paths (which may well contain "error", e.g. .../errors); everything the
# compiler or the go command reports has a space or a colon ("# pkg", "file.go:1:2: ...", "go: ...").
progress() {
  local what=$1 n=0
  while IFS= read -r line; do
    case "$line" in
      "") ;;
      *[[:space:]:]*) echo "$line" >&2 ;;
      *) n=$((n + 1)); if (( n % 100 == 0 )); then step "$what: $n packages compiled"; fi ;;
    esac
  done
  step "$what: $n packages compiled, linking done"
}

build() {  # build <module dir> <what> <ldflags> <output dir> <packages...>
  local dir=$1 what=$2 ldflags=$3 out=$4; shift 4
  step "$what: downloading modules"
  (cd "$here/$dir" && go mod download)
  step "$what: compiling (a cold build of kubernetes takes tens of minutes on 2 cores)"
  mkdir -p "$out"
  (cd "$here/$dir" && go build -v -trimpath -ldflags "$ldflags" -o "$out/" "$@" 2>&1) | progress "$what"
}

minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
k8s_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  k8s_ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  k8s_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
helm_ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
for pkg in pkg/chartutil pkg/lint/rules; do
  helm_ldflags+=" -X helm.sh/helm/v3/$pkg.k8sVersionMajor=1 -X helm.sh/helm/v3/$pkg.k8sVersionMinor=$minor"
done

build etcd etcd "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=$ETCD_VERSION" "$bin_dir.partial" go.etcd.io/etcd/server/v3
mv "$bin_dir.partial/server" "$bin_dir.partial/etcd"  # go names the main package of .../server/v3 "server"
build helm helm "$helm_ldflags" "$bin_dir.partial" helm.sh/helm/v3/cmd/helm
build k8s kubernetes "$k8s_ldflags" "$bin_dir.partial" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl k8s.io/kubernetes/cmd/kubelet

# The older kubelet goes to a directory of its own first: its binary is also named "kubelet".
legacy_ldflags=${k8s_ldflags//$K8S_VERSION/$LEGACY_KUBELET_VERSION}
legacy_ldflags=${legacy_ldflags//gitMinor=$minor/gitMinor=33}
build kubelet-1.33 "kubelet $LEGACY_KUBELET_VERSION" "$legacy_ldflags" "$bin_dir.partial/legacy" \
  k8s.io/kubernetes/cmd/kubelet
mv "$bin_dir.partial/legacy/kubelet" "$bin_dir.partial/kubelet-1.33"
rmdir "$bin_dir.partial/legacy"

rm -rf "$bin_dir"
mv "$bin_dir.partial" "$bin_dir"
complete || { echo "build finished but binaries are missing in $bin_dir" >&2; exit 1; }
step "all binaries in $bin_dir"
echo "$bin_dir"
