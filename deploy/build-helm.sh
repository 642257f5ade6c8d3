#!/usr/bin/env bash
# Build (once) and print the path of a pinned helm binary.
#
# Why: there is no Docker and no internet here except the Go module proxy, so helm is built from
# its module with `go install`, and cached OUTSIDE the repository so CI and every engineer reuse it.
# Override the cache with TF_K8S_CACHE (CI: point it at a cached directory).
set -euo pipefail

HELM_VERSION="${HELM_VERSION:-v3.21.4}"
CACHE="${TF_K8S_CACHE:-${HOME}/.cache/tensor-fusion-k8s}"
BIN_DIR="${CACHE}/bin"
HELM="${BIN_DIR}/helm-${HELM_VERSION}"

if [[ ! -x "${HELM}" ]]; then
  command -v go >/dev/null || { echo "build-helm: go is required to build helm ${HELM_VERSION}" >&2; exit 1; }
  mkdir -p "${BIN_DIR}"
  tmp="$(mktemp -d)"
  trap 'rm -rf "${tmp}"' EXIT
  echo "build-helm: building helm ${HELM_VERSION} into ${HELM} (once)" >&2
  GOBIN="${tmp}" CGO_ENABLED=0 go install "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}" >&2
  mv "${tmp}/helm" "${HELM}"
fi
echo "${HELM}"
