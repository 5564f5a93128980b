#!/usr/bin/env bash
# Builds (once) the real control-plane binaries the tests and the demo run:
# kube-apiserver, kubectl, etcd, the KubeRay operator and Helm, all from the Go
# module proxy with the go.sum files committed next to this script. Each binary
# is cached under ~/.cache/servegraph/testenv/<tool>-<version>/ so a second run
# builds nothing. KUBEBUILDER_ASSETS (setup-envtest users) supplies
# kube-apiserver and etcd when it holds them. The last line printed is the
# directory that holds every binary (plus crds/ with KubeRay's CRDs and rbac/ with its
# ClusterRole).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
cache="${SERVEGRAPH_CACHE:-$HOME/.cache/servegraph}/testenv"
mkdir -p "$cache"

export GOFLAGS="-mod=readonly -trimpath"
export CGO_ENABLED=0

log() { printf 'testenv: %s\n' "$*" >&2; }

# build TOOL_DIR VERSION BINARY PACKAGE [LDFLAGS]: go build into the cache once.
build() {
  local dir="$1" version="$2" bin="$3" pkg="$4" ldflags="${5:-}"
  local out="$cache/$bin-$version/$bin"
  if [[ -x "$out" ]]; then
    printf '%s\n' "$out"
    return
  fi
  log "building $bin $version (first run only; cached in $cache)"
  local start=$SECONDS
  mkdir -p "$(dirname "$out")"
  (cd "$here/$dir" && go build -ldflags "-s -w $ldflags" -o "$out.tmp" "$pkg")
  mv "$out.tmp" "$out"
  log "built $bin in $((SECONDS - start)) s"
  printf '%s\n' "$out"
}

k8s_ldflags() {
  local v="$KUBERNETES_VERSION" major minor
  major="${v#v}"; major="${major%%.*}"
  minor="${v#v*.}"; minor="${minor%%.*}"
  local p
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    printf -- '-X %s.gitVersion=%s -X %s.gitMajor=%s -X %s.gitMinor=%s ' \
      "$p" "$v" "$p" "$major" "$p" "$minor"
  done
}

assets="${KUBEBUILDER_ASSETS:-}"
if [[ -n "$assets" && -x "$assets/kube-apiserver" && -x "$assets/etcd" ]]; then
  log "using kube-apiserver and etcd from KUBEBUILDER_ASSETS=$assets"
  apiserver="$assets/kube-apiserver"
  etcd="$assets/etcd"
else
  apiserver=$(build kubernetes "$KUBERNETES_VERSION" kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver "$(k8s_ldflags)")
  etcd=$(build etcd "$ETCD_VERSION" etcd go.etcd.io/etcd/server/v3)
fi
kubectl=$(build kubernetes "$KUBERNETES_VERSION" kubectl k8s.io/kubernetes/cmd/kubectl "$(k8s_ldflags)")
kuberay=$(build kuberay "$KUBERAY_VERSION" kuberay-operator github.com/ray-project/kuberay/ray-operator)
helm=$(build helm "$HELM_VERSION" helm helm.sh/helm/v3/cmd/helm)

# One directory with every binary, keyed by the versions it holds.
key="k8s-$KUBERNETES_VERSION.etcd-$ETCD_VERSION.kuberay-$KUBERAY_VERSION.helm-$HELM_VERSION"
[[ -n "$assets" && "$apiserver" == "$assets/"* ]] && key="$key.assets-$(printf '%s' "$assets" | cksum | cut -d' ' -f1)"
bin="$cache/bin-$key"
# rbac/ holds KubeRay's generated ClusterRole, so the harness can run the operator with
# exactly the permissions it ships with (checked last: its presence marks a complete dir).
if [[ ! -f "$bin/rbac/kuberay-operator-role.yaml" ]]; then
  rm -rf "$bin.tmp"
  mkdir -p "$bin.tmp/crds" "$bin.tmp/rbac"
  for b in "$apiserver" "$etcd" "$kubectl" "$kuberay" "$helm"; do
    ln -sf "$b" "$bin.tmp/$(basename "$b")"
  done
  moddir=$(cd "$here/kuberay" && go list -m -f '{{.Dir}}' github.com/ray-project/kuberay/ray-operator)
  cp "$moddir"/config/crd/bases/ray.io_*.yaml "$bin.tmp/crds/"
  cp "$moddir"/config/rbac/role.yaml "$bin.tmp/rbac/kuberay-operator-role.yaml"
  chmod u+w "$bin.tmp/crds/"* "$bin.tmp/rbac/"*
  rm -rf "$bin"
  mv "$bin.tmp" "$bin"
fi
printf '%s\n' "$bin"
