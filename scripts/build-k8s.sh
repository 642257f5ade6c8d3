#!/usr/bin/env bash
# Build the real Kubernetes binaries the end-to-end tier runs against.
#
# WHY: the e2e tier drives a real kube-apiserver, kube-scheduler and kubelet, plus etcd and a fake
# CRI runtime. No prebuilt binary can be downloaded here, but the Go module proxy can: we build
# them from k8s.io/kubernetes at one pinned release, in scratch modules kept in a cache OUTSIDE
# the clone, so a second run (or a CI run on a machine that already built them) costs seconds.
#
# Usage: scripts/build-k8s.sh            build what is missing, print the bin dir last
#        scripts/build-k8s.sh --check    exit 1 if anything is missing (build nothing); print the bin dir
#        TF_K8S_CACHE=/some/dir ...      cache root (default ~/.cache/tensor-fusion-k8s)
# The last line of stdout is the bin directory; progress goes to stderr.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TAG=build-k8s
source "$REPO_ROOT/scripts/lib/go-cache.sh"  # CACHE_ROOT, log, with_ticker
K8S_VERSION="${TF_K8S_VERSION:-v1.36.2}"
ETCD_VERSION="${TF_ETCD_VERSION:-v3.6.8}"
VERSION_DIR="$CACHE_ROOT/$K8S_VERSION"
BIN="$VERSION_DIR/bin"
FAKE_CRI_SRC="$REPO_ROOT/tests/e2e/fake_cri"
# v1.X.Y of k8s.io/kubernetes pairs with v0.X.Y of every k8s.io staging module.
STAGING_VERSION="v0.${K8S_VERSION#v1.}"

need_go() {
  command -v go >/dev/null || { log "go is not installed (need Go >= 1.26 to build Kubernetes $K8S_VERSION)"; exit 1; }
}
mkdir -p "$BIN"
export GOFLAGS="${GOFLAGS:-} -mod=mod"
export CGO_ENABLED=0

# A scratch module that requires k8s.io/kubernetes and pins each staging module it replaces
# with a local path (k8s.io/api => ./staging/src/k8s.io/api) to the matching published version.
prepare_k8s_module() {
  local dir="$VERSION_DIR/k8s-module"
  if [[ -f "$dir/.ready" ]]; then echo "$dir"; return; fi
  need_go
  log "preparing scratch module for k8s.io/kubernetes@$K8S_VERSION in $dir"
  rm -rf "$dir" && mkdir -p "$dir"
  (
    cd "$dir"
    go mod init tensor-fusion-k8s/build >/dev/null 2>&1
    local gomod
    gomod="$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
    local staged
    staged="$(sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\1#p' "$gomod")"
    local args=()
    for m in $staged; do args+=("-replace=$m=$m@$STAGING_VERSION"); done
    go mod edit "${args[@]}"
    log "resolving dependencies (first run downloads ~300 modules)"
    go get "k8s.io/kubernetes/cmd/kube-apiserver@$K8S_VERSION" \
      "k8s.io/kubernetes/cmd/kube-scheduler@$K8S_VERSION" \
      "k8s.io/kubernetes/cmd/kubelet@$K8S_VERSION" \
      "k8s.io/kubernetes/cmd/kube-controller-manager@$K8S_VERSION" \
      "k8s.io/cri-client/pkg/fake@$STAGING_VERSION" >&2
  )
  touch "$dir/.ready"
  echo "$dir"
}

# Every missing Kubernetes binary in one `go build`, so shared packages compile once, in parallel.
build_k8s_binaries() {
  local missing=()
  for name in "$@"; do
    if [[ -x "$BIN/$name" ]]; then log "$name: cached"; else missing+=("$name"); fi
  done
  [[ ${#missing[@]} -eq 0 ]] && return
  local dir pkgs=()
  dir="$(prepare_k8s_module)"
  for name in "${missing[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$name"); done
  log "building ${missing[*]} (cold: 10+ minutes on 2 cores)"
  rm -rf "$BIN/.partial" && mkdir -p "$BIN/.partial"
  (cd "$dir" && with_ticker go build -trimpath -ldflags "-s -w \
      -X k8s.io/component-base/version.gitVersion=$K8S_VERSION \
      -X k8s.io/component-base/version.gitMajor=1 \
      -X k8s.io/component-base/version.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2)" \
      -o "$BIN/.partial/" "${pkgs[@]}")
  for name in "${missing[@]}"; do mv "$BIN/.partial/$name" "$BIN/$name"; done
  rmdir "$BIN/.partial"
  log "built ${missing[*]}"
}

build_etcd() {
  if [[ -x "$BIN/etcd" ]]; then log "etcd: cached"; return; fi
  local dir="$VERSION_DIR/etcd-module"
  need_go
  log "etcd $ETCD_VERSION: building"
  rm -rf "$dir" && mkdir -p "$dir"
  (
    cd "$dir"
    go mod init tensor-fusion-k8s/etcd >/dev/null 2>&1
    go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >&2
    with_ticker go build -trimpath -ldflags "-s -w" -o "$BIN/etcd.tmp" go.etcd.io/etcd/server/v3
  )
  mv "$BIN/etcd.tmp" "$BIN/etcd"
  log "etcd: built"
}

# The fake CRI runtime is our own small main (tests/e2e/fake_cri/main.go) over the in-memory
# runtime that k8s.io/cri-client ships; it is rebuilt when its source changes.
build_fake_cri() {
  local sum
  sum="$(sha256sum "$FAKE_CRI_SRC/main.go" | cut -c1-16)"
  if [[ -x "$BIN/fake-cri-$sum" ]]; then log "fake-cri: cached"; ln -sf "fake-cri-$sum" "$BIN/fake-cri"; return; fi
  local dir
  dir="$(prepare_k8s_module)"
  log "fake-cri: building"
  mkdir -p "$dir/fakecri"
  cp "$FAKE_CRI_SRC/main.go" "$dir/fakecri/main.go"
  (cd "$dir" && go build -trimpath -o "$BIN/fake-cri-$sum" ./fakecri)
  find "$BIN" -maxdepth 1 -name 'fake-cri-*' ! -name "fake-cri-$sum" -delete
  ln -sf "fake-cri-$sum" "$BIN/fake-cri"
  log "fake-cri: built"
}

if [[ "${1:-}" == "--check" ]]; then
  echo "$BIN"
  sum="$(sha256sum "$FAKE_CRI_SRC/main.go" | cut -c1-16)"
  for name in etcd kube-apiserver kube-scheduler kube-controller-manager kubelet "fake-cri-$sum"; do
    [[ -x "$BIN/$name" ]] || { log "missing: $BIN/$name"; exit 1; }
  done
  exit 0
fi

build_etcd
build_k8s_binaries kube-apiserver kube-scheduler kube-controller-manager kubelet
build_fake_cri
log "done in $(($(date +%s) - START))s: $BIN"
echo "$BIN"
