#!/usr/bin/env bash
# The deploy/ check CI runs: build (once, cached) helm, lint the chart in every TLS mode, render it,
# and verify the committed plain manifests in deploy/manifests/ are what the chart renders.
#
#   deploy/check.sh            check (exit 1 and a diff when deploy/manifests is stale)
#   deploy/check.sh --update   re-render deploy/manifests from the chart
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
chart="${here}/helm/tensor-fusion"
out="${here}/manifests"
KUBE_VERSION="${KUBE_VERSION:-1.36.2}"
NAMESPACE="tensor-fusion-system"
helm="$("${here}/build-helm.sh")"
tmp="$(mktemp -d)"
trap 'rm -rf "${tmp}"' EXIT

# Every option that changes which templates render must lint and render.
variants=(
  ""
  "--set webhook.tls.mode=cert-manager"
  "--set webhook.tls.mode=cert-manager --set webhook.tls.certManager.issuerRef.name=ca --set webhook.tls.certManager.issuerRef.kind=ClusterIssuer"
  "--set webhook.tls.mode=provided --set webhook.tls.caBundle=Q0E= --set webhook.externalURL=https://127.0.0.1:9443/mutate"
  "--set serviceMonitor.enabled=true --set devicePlugin.backend=hami-core --set priorityClasses.create=false --set admissionPolicy.create=false"
  "--set gpuCatalog[0].key=A10G --set gpuCatalog[0].tflops=70 --set devicePlugin.backend=hami-core"
)
for v in "${variants[@]}"; do
  # shellcheck disable=SC2086
  "${helm}" lint --strict --kube-version "${KUBE_VERSION}" "${chart}" ${v} 2>&1 | grep -v "symbolic link" >"${tmp}/lint.log" \
    || { cat "${tmp}/lint.log"; exit 1; }
  # shellcheck disable=SC2086
  "${helm}" template tensor-fusion "${chart}" -n "${NAMESPACE}" --kube-version "${KUBE_VERSION}" ${v} \
    >"${tmp}/render.yaml" 2> >(grep -v "symbolic link" >&2)
done
"${helm}" template tensor-fusion "${chart}" -n "${NAMESPACE}" --kube-version "${KUBE_VERSION}" \
  >"${tmp}/default.yaml" 2> >(grep -v "symbolic link" >&2)
echo "helm template (default values): $(wc -l <"${tmp}/default.yaml") lines, $(wc -c <"${tmp}/default.yaml") bytes"

# The plain manifests: deterministic (cert-manager issues the certificate, no generated keys).
"${helm}" template tensor-fusion "${chart}" -n "${NAMESPACE}" --kube-version "${KUBE_VERSION}" \
  -f "${here}/manifests-values.yaml" --output-dir "${tmp}/manifests" 2> >(grep -v "symbolic link" >&2) >/dev/null
rendered="${tmp}/manifests/tensor-fusion/templates"
if [[ "${1:-}" == "--update" ]]; then
  rm -rf "${out}" && mkdir -p "${out}" && cp "${rendered}"/*.yaml "${out}/"
  echo "deploy/manifests re-rendered"
elif ! diff -ru "${out}" "${rendered}"; then
  echo "deploy/manifests is stale: run deploy/check.sh --update and commit" >&2
  exit 1
fi
echo "deploy check: ok"
