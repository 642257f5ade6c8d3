#!/usr/bin/env bash
# Build the real Karpenter controller with its kwok cloud provider that tests/e2e/test_karpenter.py runs,
# and keep its CRDs.
#
# WHY: whether Karpenter provisions a GPU node for a pending GPU-share pod is Karpenter's own scheduling
# simulation over the instance types it is given (docs/karpenter.md); only the real controller shows it.
# Its kwok provider (sigs.k8s.io/karpenter/kwok) creates Node objects instead of instances, so it runs
# against the e2e control plane. As for the Kubernetes binaries (scripts/build-k8s.sh), nothing prebuilt
# can be downloaded here but the Go module proxy can: sigs.k8s.io/karpenter has no replace directives, so
# `go install module@version` builds it with exactly its own go.mod, into a cache OUTSIDE the clone; a
# second run costs a second.
# v1.14.1 is the newest release whose go.mod this machine's Go (1.26.8, GOTOOLCHAIN=local) builds:
# v1.14.3 asks for go 1.26.10 and v1.15.0 for go 1.26.9. Set TF_KARPENTER_VERSION to try another.
# The CRDs are the kwok chart's (NodePool, NodeClaim, NodeOverlay, CapacityBuffer: the core ones plus the
# kwok label-domain rule) and the KWOKNodeClass from kwok/apis/crds.
#
# Usage: scripts/build-karpenter.sh            build what is missing, print the Karpenter dir last
#        scripts/build-karpenter.sh --check    exit 1 if anything is missing (build nothing); print the dir
#        TF_K8S_CACHE=/some/dir ...            cache root (default ~/.cache/tensor-fusion-k8s)
# The last line of stdout is the directory holding bin/karpenter-kwok and config/crd/*.yaml;
# progress goes to stderr.
set -euo pipefail

KARPENTER_VERSION="${TF_KARPENTER_VERSION:-v1.14.1}"
CACHE_ROOT="${TF_K8S_CACHE:-$HOME/.cache/tensor-fusion-k8s}"
DIR="$CACHE_ROOT/karpenter-$KARPENTER_VERSION"

START=$(date +%s)
log() { printf '[build-karpenter %3ds] %s\n' "$(($(date +%s) - START))" "$*" >&2; }

ready() { [[ -x "$DIR/bin/karpenter-kwok" && -f "$DIR/config/.ready" ]]; }

if [[ "${1:-}" == "--check" ]]; then
  echo "$DIR"
  ready || { log "missing: $DIR/bin/karpenter-kwok or $DIR/config"; exit 1; }
  exit 0
fi
if ready; then log "karpenter $KARPENTER_VERSION: cached"; echo "$DIR"; exit 0; fi
command -v go >/dev/null || { log "go is not installed (need Go >= 1.26.6 to build Karpenter $KARPENTER_VERSION)"; exit 1; }

export CGO_ENABLED=0
mkdir -p "$DIR/bin"
if [[ ! -x "$DIR/bin/karpenter-kwok" ]]; then
  log "karpenter $KARPENTER_VERSION: building sigs.k8s.io/karpenter/kwok (cold: about 5 minutes on 2 cores)"
  rm -rf "$DIR/.partial" && mkdir -p "$DIR/.partial"
  # `go install` prints nothing until it is done: log every 30 s meanwhile, so CI logs show it is alive.
  GOBIN="$DIR/.partial" go install -trimpath \
    -ldflags "-s -w -X sigs.k8s.io/karpenter/pkg/operator.Version=$KARPENTER_VERSION" \
    "sigs.k8s.io/karpenter/kwok@$KARPENTER_VERSION" &
  pid=$! waited=0
  trap 'kill $pid 2>/dev/null' EXIT
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    waited=$((waited + 1))
    if ((waited % 30 == 0)); then log "go install still running (${waited}s)"; fi
  done
  trap - EXIT
  wait "$pid"
  mv "$DIR/.partial/kwok" "$DIR/bin/karpenter-kwok"
  rmdir "$DIR/.partial"
  log "karpenter (kwok provider): built"
fi

src="$(go mod download -json "sigs.k8s.io/karpenter@$KARPENTER_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
rm -rf "$DIR/config" && mkdir -p "$DIR/config/crd"
cp "$src"/kwok/charts/crds/*.yaml "$src"/kwok/apis/crds/*.yaml "$DIR/config/crd/"
chmod -R u+w "$DIR/config"
touch "$DIR/config/.ready"
log "done in $(($(date +%s) - START))s: $DIR"
echo "$DIR"
