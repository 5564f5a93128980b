#!/usr/bin/env bash
# Builds (once) every binary the test bed runs, from the Go module proxy with the
# go.sum files committed next to this script, plus the Debian packages a node needs:
#   control plane: kube-apiserver, etcd, kubectl, the KubeRay operator (and the previous
#                  KubeRay servegraph supports, for the integration tier), Helm
#   node:          kubelet, kube-controller-manager, kube-scheduler, kube-proxy,
#                  CoreDNS (kubernetes plugin), pause (Kubernetes' own pause.c),
#                  Traefik (the Gateway API implementation);
#                  containerd, runc, CNI plugins, iptables, conntrack, buildah and
#                  mmdebstrap from Debian (installed with apt-get when missing);
#                  Prometheus (the observability tests scrape the node with it);
#   every tier:    graphviz from Debian (`servegraph inspect -o svg`'s renderer).
# Each binary is cached under ~/.cache/servegraph/testenv/<tool>-<version>/ so a second
# run builds nothing. KUBEBUILDER_ASSETS (setup-envtest users) supplies kube-apiserver
# and etcd when it holds them. The last line printed is the directory that holds
# every binary (plus crds/ with KubeRay's CRDs, rbac/ with its ClusterRole,
# kuberay-config/ with its kustomize tree, gateway-crds/ with the Gateway API's, and
# kuberay-previous/ with the previous KubeRay's operator, crds/ and rbac/).
#
# SERVEGRAPH_TESTBED_TIER=controlplane skips the node's binaries and packages;
# SERVEGRAPH_TESTBED_TIER=manifests builds nothing: it prints a directory with only the
# manifests above (crds/, rbac/, kuberay-config/, gateway-crds/, kuberay-previous/crds/ and
# rbac/), which come from the Go module downloads, so the unit tier can run in the minutes a
# cold build of the binaries takes.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
cache="${SERVEGRAPH_CACHE:-$HOME/.cache/servegraph}/testenv"
tier="${SERVEGRAPH_TESTBED_TIER:-node}"
mkdir -p "$cache"
# One build at a time: two runs at once (a test run and a helper's, say) would both build
# into the same temporary directory and one would lose its binaries. The second waits,
# then finds everything built.
exec 9>"$cache/.build.lock"
flock 9

export GOFLAGS="-mod=readonly -trimpath"
export CGO_ENABLED=0

log() { printf 'testenv: %s\n' "$*" >&2; }

# The KubeRay module's zip. The Go module proxy lists v1.7.0 (its .info and .mod) but refuses
# its zip ("403 This module version is not available"). Then the zip is made from the
# release's tag in KubeRay's Git repository ($SERVEGRAPH_KUBERAY_GIT, a URL or a local
# clone), with the proxy's own rules (modzip/, golang.org/x/mod/zip), and served to the go
# command from a file:// proxy in the cache. The go command checks it against go.sum, whose
# hash is the checksum database's (sum.golang.org), so what is built is the release
# whichever way it came.
kuberay_module() {
  local mod=github.com/ray-project/kuberay/ray-operator proxy="$cache/goproxy"
  local dir="$proxy/$mod/@v"
  if (cd "$here/kuberay" && go mod download "$mod") 2>/dev/null; then
    return
  fi
  local repo="${SERVEGRAPH_KUBERAY_GIT:-https://github.com/ray-project/kuberay.git}" tag="ray-operator/$KUBERAY_VERSION"
  log "the Go module proxy refuses $mod@$KUBERAY_VERSION's zip: making it from tag $tag of $repo"
  local tmp
  tmp=$(mktemp -d)
  if ! git clone -q --no-checkout "$repo" "$tmp/kuberay" ||
    ! git -C "$tmp/kuberay" fetch -q origin "refs/tags/$tag:refs/tags/$tag"; then
    rm -rf "$tmp"
    log "cannot read tag $tag from $repo: set SERVEGRAPH_KUBERAY_GIT to a clone of"
    log "https://github.com/ray-project/kuberay that has it (its zip is checked against go.sum either way)"
    exit 1
  fi
  mkdir -p "$dir"
  (cd "$here/modzip" && go run . "$tmp/kuberay" "$tag" ray-operator "$mod" "$KUBERAY_VERSION" "$dir/$KUBERAY_VERSION.zip")
  rm -rf "$tmp"
  # The proxy serves the version's .info and .mod: the go command fetches them itself.
  local meta
  meta=$(cd "$here/kuberay" && go list -m -json "$mod@$KUBERAY_VERSION" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')
  cp "${meta%.mod}.info" "$dir/$KUBERAY_VERSION.info"
  cp "$meta" "$dir/$KUBERAY_VERSION.mod"
  printf '%s\n' "$KUBERAY_VERSION" >"$dir/list"
  (cd "$here/kuberay" && go mod download "$mod")  # checked against go.sum here
}

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

# build_kubernetes CMD...: every missing command of k8s.io/kubernetes in ONE go build,
# so the packages they share compile once and both cores stay busy (a cold build of all
# six takes about as long as kube-apiserver alone). Prints each binary's path.
build_kubernetes() {
  local missing=() cmd
  for cmd in "$@"; do
    [[ -x "$cache/$cmd-$KUBERNETES_VERSION/$cmd" ]] || missing+=("$cmd")
  done
  if ((${#missing[@]})); then
    log "building ${missing[*]} $KUBERNETES_VERSION in one go build (first run only; cached in $cache)"
    local start=$SECONDS tmp="$cache/kubernetes-$KUBERNETES_VERSION.tmp" pkgs=()
    rm -rf "$tmp" && mkdir -p "$tmp"
    for cmd in "${missing[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$cmd"); done
    (cd "$here/kubernetes" && go build -ldflags "-s -w $(k8s_ldflags)" -o "$tmp/" "${pkgs[@]}")
    for cmd in "${missing[@]}"; do
      mkdir -p "$cache/$cmd-$KUBERNETES_VERSION"
      mv "$tmp/$cmd" "$cache/$cmd-$KUBERNETES_VERSION/$cmd"
    done
    rm -rf "$tmp"
    log "built ${missing[*]} in $((SECONDS - start)) s"
  fi
  for cmd in "$@"; do printf '%s\n' "$cache/$cmd-$KUBERNETES_VERSION/$cmd"; done
}

# The pause image's binary, from Kubernetes' own build/pause/linux/pause.c (static C).
build_pause() {
  local out="$cache/pause-$PAUSE_VERSION/pause"
  if [[ ! -x "$out" ]]; then
    log "building pause $PAUSE_VERSION from k8s.io/kubernetes build/pause/linux/pause.c"
    local src
    src=$(cd "$here/kubernetes" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c
    mkdir -p "$(dirname "$out")"
    gcc -Os -Wall -Werror -static -DVERSION="v$PAUSE_VERSION-servegraph" -o "$out.tmp" "$src"
    mv "$out.tmp" "$out"
  fi
  printf '%s\n' "$out"
}

# Prometheus' release from its Go module's version: v0.316.0 is Prometheus 3.16.0.
prometheus_release() {
  local v="${PROMETHEUS_VERSION#v0.}"
  printf '%s.%s\n' "${v:0:1}" "${v:1}"
}

# Debian packages of the node and the image builds; installed only when a tool is missing.
install_packages() {
  local need=() pair
  for pair in containerd:containerd runc:runc iptables:iptables conntrack:conntrack \
    buildah:buildah mmdebstrap:mmdebstrap gcc:gcc; do
    command -v "${pair%%:*}" >/dev/null || need+=("${pair#*:}")
  done
  [[ -x /usr/lib/cni/bridge ]] || need+=(containernetworking-plugins)
  dpkg -s libc6-dev >/dev/null 2>&1 || need+=(libc6-dev)  # pause is linked statically
  if ((${#need[@]})); then
    if [[ $(id -u) -ne 0 ]]; then
      log "missing Debian packages: ${need[*]} (run as root, or: sudo apt-get install ${need[*]})"
      exit 1
    fi
    log "installing Debian packages: ${need[*]}"
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
  fi
}

# Graphviz's dot draws `servegraph inspect -o svg` in the unit tier, whatever the tier built here.
install_graphviz() {
  command -v dot >/dev/null && return
  if [[ $(id -u) -ne 0 ]]; then
    log "missing Debian package: graphviz (tests/unit/test_inspect_svg.py needs dot; run as root, or: sudo apt-get install graphviz)"
    return
  fi
  log "installing Debian package: graphviz"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends graphviz >&2
}
install_graphviz

# The file:// proxy first: it holds only what kuberay_module made (the proxy says 404 for the
# rest, and the go command then asks the next one).
mkdir -p "$cache/goproxy"
export GOPROXY="file://$cache/goproxy,$(go env GOPROXY)"

# module_dir DIR MODULE: where the module DIR's go.mod requires is unpacked (downloaded once).
module_dir() {
  (cd "$here/$1" && go mod download "$2" && go list -m -f '{{.Dir}}' "$2")
}

# copy_manifests DEST: KubeRay's CRDs, ClusterRole and kustomize tree, the previous KubeRay's
# CRDs and ClusterRole, and the Gateway API's standard CRDs, laid out as Binaries reads them.
copy_manifests() {
  local dest="$1" moddir prevdir gwdir
  moddir=$(module_dir kuberay github.com/ray-project/kuberay/ray-operator)
  mkdir -p "$dest/crds" "$dest/rbac"
  cp "$moddir"/config/crd/bases/ray.io_*.yaml "$dest/crds/"
  # KubeRay's own kustomize install (config/default and what it references), for the
  # node tier to install KubeRay exactly as its users do.
  cp -r "$moddir/config" "$dest/kuberay-config"
  cp "$moddir"/config/rbac/role.yaml "$dest/rbac/kuberay-operator-role.yaml"
  # The previous KubeRay's CRDs and ClusterRole (its operator is linked beside them by the
  # binaries' directory), for the unit and integration tiers.
  prevdir=$(module_dir kuberay-previous github.com/ray-project/kuberay/ray-operator)
  mkdir -p "$dest/kuberay-previous/crds" "$dest/kuberay-previous/rbac"
  cp "$prevdir"/config/crd/bases/ray.io_*.yaml "$dest/kuberay-previous/crds/"
  cp "$prevdir"/config/rbac/role.yaml "$dest/kuberay-previous/rbac/kuberay-operator-role.yaml"
  # The Gateway API's standard CRDs, at the version KubeRay builds against: its incremental
  # upgrade creates Gateways and HTTPRoutes. Traefik must build against the same minor
  # version (it watches exactly the kinds and versions of its Gateway API module).
  gwdir=$(module_dir kuberay sigs.k8s.io/gateway-api)
  mkdir -p "$dest/gateway-crds"
  cp "$gwdir"/config/crd/standard/gateway.networking.k8s.io_*.yaml "$dest/gateway-crds/"
}

if [[ "$tier" == manifests ]]; then
  dir="$cache/manifests-1.kuberay-$KUBERAY_VERSION-$KUBERAY_PREVIOUS_VERSION"
  if [[ ! -f "$dir/.complete" ]]; then
    kuberay_module
    rm -rf "$dir.tmp"
    copy_manifests "$dir.tmp"
    chmod -R u+w "$dir.tmp"
    touch "$dir.tmp/.complete"
    rm -rf "$dir"
    mv "$dir.tmp" "$dir"
  fi
  printf '%s\n' "$dir"
  exit 0
fi

assets="${KUBEBUILDER_ASSETS:-}"
k8s_cmds=(kubectl)
if [[ -n "$assets" && -x "$assets/kube-apiserver" && -x "$assets/etcd" ]]; then
  log "using kube-apiserver and etcd from KUBEBUILDER_ASSETS=$assets"
  apiserver="$assets/kube-apiserver"
  etcd="$assets/etcd"
else
  k8s_cmds+=(kube-apiserver)
  etcd=$(build etcd "$ETCD_VERSION" etcd go.etcd.io/etcd/server/v3)
fi
node_bins=()
if [[ "$tier" == node ]]; then
  install_packages
  k8s_cmds+=(kubelet kube-controller-manager kube-scheduler kube-proxy)
fi
build_kubernetes "${k8s_cmds[@]}" >/dev/null
k8s() { printf '%s\n' "$cache/$1-$KUBERNETES_VERSION/$1"; }
[[ -n "${apiserver:-}" ]] || apiserver=$(k8s kube-apiserver)
kubectl=$(k8s kubectl)
[[ -x "$cache/kuberay-operator-$KUBERAY_VERSION/kuberay-operator" ]] || kuberay_module
kuberay=$(build kuberay "$KUBERAY_VERSION" kuberay-operator github.com/ray-project/kuberay/ray-operator)
kuberay_previous=$(build kuberay-previous "$KUBERAY_PREVIOUS_VERSION" kuberay-operator github.com/ray-project/kuberay/ray-operator)
helm=$(build helm "$HELM_VERSION" helm helm.sh/helm/v3/cmd/helm)
if [[ "$tier" == node ]]; then
  for cmd in kubelet kube-controller-manager kube-scheduler kube-proxy; do node_bins+=("$(k8s "$cmd")"); done
  node_bins+=("$(build coredns "$COREDNS_VERSION" coredns servegraph.local/testenv/coredns)")
  node_bins+=("$(build_pause)")
  node_bins+=("$(build traefik "$TRAEFIK_VERSION" traefik github.com/traefik/traefik/v3/cmd/traefik \
    "-X github.com/traefik/traefik/v3/pkg/version.Version=${TRAEFIK_VERSION#v}")")
  # The web UI's assets are not needed (tests use the HTTP API): without the `builtinassets`
  # tag Prometheus serves them from disk and builds without Node.js. `remove_all_sd` with
  # `enable_kubernetes_sd` links one service discovery (the test bed's pods) instead of
  # every cloud provider's SDK.
  node_bins+=("$(GOFLAGS="$GOFLAGS -tags=remove_all_sd,enable_kubernetes_sd" build prometheus "$PROMETHEUS_VERSION" \
    prometheus github.com/prometheus/prometheus/cmd/prometheus \
    "-X github.com/prometheus/common/version.Version=$(prometheus_release)")")
fi

# One directory with every binary, keyed by the versions it holds.
# (layout-N: bump when the directory's contents change shape.)
key="layout-3.k8s-$KUBERNETES_VERSION.etcd-$ETCD_VERSION.kuberay-$KUBERAY_VERSION-$KUBERAY_PREVIOUS_VERSION.helm-$HELM_VERSION"
[[ "$tier" == node ]] && key="$key.coredns-$COREDNS_VERSION.pause-$PAUSE_VERSION.prometheus-$PROMETHEUS_VERSION.traefik-$TRAEFIK_VERSION"
[[ -n "$assets" && "$apiserver" == "$assets/"* ]] && key="$key.assets-$(printf '%s' "$assets" | cksum | cut -d' ' -f1)"
bin="$cache/bin-$key"
# rbac/ holds KubeRay's generated ClusterRole, so the harness can run the operator with
# exactly the permissions it ships with. .complete is written last and marks a whole dir.
if [[ ! -f "$bin/.complete" ]]; then
  rm -rf "$bin.tmp"
  copy_manifests "$bin.tmp"
  for b in "$apiserver" "$etcd" "$kubectl" "$kuberay" "$helm" "${node_bins[@]}"; do
    ln -sf "$b" "$bin.tmp/$(basename "$b")"
  done
  ln -sf "$kuberay_previous" "$bin.tmp/kuberay-previous/kuberay-operator"
  if [[ "$tier" == node ]]; then
    gw_kuberay=$(cd "$here/kuberay" && go list -m -f '{{.Version}}' sigs.k8s.io/gateway-api)
    gw_traefik=$(cd "$here/traefik" && go list -m -f '{{.Version}}' sigs.k8s.io/gateway-api)
    if [[ "${gw_kuberay%.*}" != "${gw_traefik%.*}" ]]; then
      log "KubeRay builds against Gateway API $gw_kuberay, Traefik against $gw_traefik: pick versions that agree"
      exit 1
    fi
    # Kubernetes' own Dockerfile of the pause image, built by the test bed around our pause.
    k8sdir=$(cd "$here/kubernetes" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)
    cp "$k8sdir/build/pause/Dockerfile" "$bin.tmp/pause.Dockerfile"
  fi
  chmod -R u+w "$bin.tmp"
  touch "$bin.tmp/.complete"
  rm -rf "$bin"
  mv "$bin.tmp" "$bin"
fi
printf '%s\n' "$bin"
