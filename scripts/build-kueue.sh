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

TAG=build-kueue
TOOL=kueue
TOOL_VERSION="${TF_KUEUE_VERSION:-v0.17.0}"
MODULE=sigs.k8s.io/kueue
PACKAGE=$MODULE/cmd/kueue
BINARY=kueue
LDFLAGS="-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$TOOL_VERSION"
COLD_MINUTES=8

copy_config() {
  cp "$1"/config/components/crd/bases/*.yaml "$2/crd/"
  cp "$1/config/components/webhook/manifests.yaml" "$2/webhooks.yaml"
}

source "$(dirname "${BASH_SOURCE[0]}")/lib/go-cache.sh"
go_tool_main "$@"
