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

TAG=build-karpenter
TOOL=karpenter
TOOL_VERSION="${TF_KARPENTER_VERSION:-v1.14.1}"
MODULE=sigs.k8s.io/karpenter
PACKAGE=$MODULE/kwok
BINARY=karpenter-kwok
LDFLAGS="-s -w -X sigs.k8s.io/karpenter/pkg/operator.Version=$TOOL_VERSION"
COLD_MINUTES=5

copy_config() {
  cp "$1"/kwok/charts/crds/*.yaml "$1"/kwok/apis/crds/*.yaml "$2/crd/"
}

source "$(dirname "${BASH_SOURCE[0]}")/lib/go-cache.sh"
go_tool_main "$@"
