#!/usr/bin/env bash
# Build the real Kueue controller manager that tests/e2e/test_kueue.py runs, and keep its CRDs and webhooks.
#
# WHY: the Kueue scenario drives the real controller, not a stand-in. As for the Kubernetes
# binaries (scripts/build-k8s.sh), nothing prebuilt can be downloaded here but the Go module proxy
# can: sigs.k8s.io/kueue has no replace directives, so `go install module@version` builds it with
# exactly its own go.mod, into a cache OUTSIDE the clone; a second run costs a second.
# The CRDs are copied from the module's config/components/crd/bases (without the conversion-webhook
# patches: everything here speaks v1beta2, Kueue's storage version), and its webhook configurations from
# config/components/webhook/manifests.yaml (tests/e2e/kueue.py registers the entries it serves by URL).
#
# Usage: scripts/build-kueue.sh            build what is missing, print the Kueue dir last
#        scripts/build-kueue.sh --check    exit 1 if anything is missing (build nothing); print the dir
#        TF_K8S_CACHE=/some/dir ...        cache root (default ~/.cache/tensor-fusion-k8s)
# The last line of stdout is the directory holding bin/kueue, config/crd/*.yaml and config/webhooks.yaml;
# progress goes to stderr.
set -euo pipefail

KUEUE_VERSION="${TF_KUEUE_VERSION:-v0.17.0}"
CACHE_ROOT="${TF_K8S_CACHE:-$HOME/.cache/tensor-fusion-k8s}"
DIR="$CACHE_ROOT/kueue-$KUEUE_VERSION"

START=$(date +%s)
log() { printf '[build-kueue %3ds] %s\n' "$(($(date +%s) - START))" "$*" >&2; }

ready() { [[ -x "$DIR/bin/kueue" && -f "$DIR/config/.ready" ]]; }

if [[ "${1:-}" == "--check" ]]; then
  echo "$DIR"
  ready || { log "missing: $DIR/bin/kueue or $DIR/config"; exit 1; }
  exit 0
fi
if ready; then log "kueue $KUEUE_VERSION: cached"; echo "$DIR"; exit 0; fi
command -v go >/dev/null || { log "go is not installed (need Go >= 1.25 to build Kueue $KUEUE_VERSION)"; exit 1; }

export CGO_ENABLED=0
mkdir -p "$DIR/bin"
if [[ ! -x "$DIR/bin/kueue" ]]; then
  log "kueue $KUEUE_VERSION: building sigs.k8s.io/kueue/cmd/kueue (cold: about 8 minutes on 2 cores)"
  rm -rf "$DIR/.partial" && mkdir -p "$DIR/.partial"
  # `go install` prints nothing until it is done: log every 30 s meanwhile, so CI logs show it is alive.
  GOBIN="$DIR/.partial" go install -trimpath -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION" \
    "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION" &
  pid=$! waited=0
  trap 'kill $pid 2>/dev/null' EXIT
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    waited=$((waited + 1))
    if ((waited % 30 == 0)); then log "go install still running (${waited}s)"; fi
  done
  trap - EXIT
  wait "$pid"
  mv "$DIR/.partial/kueue" "$DIR/bin/kueue"
  rmdir "$DIR/.partial"
  log "kueue: built"
fi

src="$(go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
rm -rf "$DIR/config" && mkdir -p "$DIR/config/crd"
cp "$src"/config/components/crd/bases/*.yaml "$DIR/config/crd/"
cp "$src/config/components/webhook/manifests.yaml" "$DIR/config/webhooks.yaml"
chmod -R u+w "$DIR/config"
touch "$DIR/config/.ready"
log "done in $(($(date +%s) - START))s: $DIR"
echo "$DIR"
