#!/usr/bin/env bash
# The deploy/ check CI runs: build (once, cached) helm, verify the chart's crds/ and files/ are copies of
# deploy/crds, deploy/dashboards and deploy/alerts, check the alert rules with promtool (Debian's prometheus
# package; scripts/bootstrap installs it), lint the chart in every TLS mode for the oldest and newest
# Kubernetes it supports, render it, and verify the committed plain manifests in deploy/manifests/ are what
# the chart renders.
#
#   deploy/check.sh            check (exit 1 and a diff when the chart's copies or deploy/manifests are stale)
#   deploy/check.sh --update   copy deploy/crds, dashboards and alerts into the chart and re-render deploy/manifests
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
chart="${here}/helm/tensor-fusion"
out="${here}/manifests"
KUBE_VERSION="${KUBE_VERSION:-1.36.2}"
KUBE_VERSIONS=(1.30.4 "${KUBE_VERSION}")   # the minimum (ValidatingAdmissionPolicy v1) and the newest tested
NAMESPACE="tensor-fusion-system"
helm="$("${here}/build-helm.sh")"
tmp="$(mktemp -d)"
trap 'rm -rf "${tmp}"' EXIT

# deploy/crds, deploy/dashboards and deploy/alerts are the sources; helm reads real files inside the chart
# (a link makes every helm command warn), so the chart holds copies, never edited by hand.
copies=("crds:crds" "dashboards:files/dashboards" "alerts:files/alerts")
for pair in "${copies[@]}"; do
  src="${here}/${pair%%:*}" dst="${chart}/${pair#*:}"
  if [[ "${1:-}" == "--update" ]]; then
    rm -rf "${dst}" && mkdir -p "$(dirname "${dst}")" && cp -r "${src}" "${dst}"
  elif ! diff -ru "${src}" "${dst}"; then
    echo "the chart's ${pair#*:}/ differs from deploy/${pair%%:*}: run deploy/check.sh --update and commit" >&2
    exit 1
  fi
done

# The alert rules parse and their expressions are valid PromQL; tests/e2e/test_dashboard.py evaluates them.
if command -v promtool >/dev/null; then
  promtool check rules "${here}/alerts/tensor-fusion.rules.yaml"
elif [[ "${TF_E2E_REQUIRED:-}" == "1" ]]; then
  echo "promtool is missing (Debian: apt-get install prometheus; scripts/bootstrap does, as root)" >&2
  exit 1
else
  echo "WARNING: promtool is missing: the alert rules are NOT checked (apt-get install prometheus)" >&2
fi

# Every option that changes which templates render must lint and render.
variants=(
  ""
  "--set webhook.tls.mode=cert-manager"
  "--set webhook.tls.mode=cert-manager --set webhook.tls.certManager.issuerRef.name=ca --set webhook.tls.certManager.issuerRef.kind=ClusterIssuer"
  "--set webhook.tls.mode=provided --set webhook.tls.caBundle=Q0E= --set webhook.externalURL=https://127.0.0.1:9443/mutate"
  "--set serviceMonitor.enabled=true --set prometheusRule.enabled=true --set devicePlugin.backend=hami-core --set priorityClasses.create=false --set admissionPolicy.create=false"
  "--set serviceMonitor.enabled=true --set metricsApi.enabled=false --set grafanaDashboard.namespace=monitoring"
  "--set gpuCatalog[0].key=A10G --set gpuCatalog[0].tflops=70 --set devicePlugin.backend=hami-core"
  "--set metricsApi.tls.mode=cert-manager --set metricsApi.tls.certManager.issuerRef.name=ca --set metricsApi.tls.certManager.issuerRef.kind=ClusterIssuer"
  "--set metricsApi.tls.mode=provided --set metricsApi.tls.caBundle=Q0E= --set metricsApi.replicas=1"
  "--set metricsApi.enabled=false"
  "--set devicePlugin.backend=mps"
)
for kube in "${KUBE_VERSIONS[@]}"; do
  for v in "${variants[@]}"; do
    # shellcheck disable=SC2086
    "${helm}" lint --strict --kube-version "${kube}" "${chart}" ${v} >"${tmp}/lint.log" 2>&1 \
      || { cat "${tmp}/lint.log"; exit 1; }
    # shellcheck disable=SC2086
    "${helm}" template tensor-fusion "${chart}" -n "${NAMESPACE}" --kube-version "${kube}" ${v} >"${tmp}/render.yaml"
  done
done
# Without --kube-version helm renders for its own default, Kubernetes v1.20.0: no cluster to refuse, so it renders.
"${helm}" template tensor-fusion "${chart}" -n "${NAMESPACE}" >/dev/null
"${helm}" template tensor-fusion "${chart}" -n "${NAMESPACE}" --kube-version "${KUBE_VERSION}" >"${tmp}/default.yaml"
echo "helm template (default values): $(wc -l <"${tmp}/default.yaml") lines, $(wc -c <"${tmp}/default.yaml") bytes"

# The plain manifests: deterministic (cert-manager issues the certificate, no generated keys).
"${helm}" template tensor-fusion "${chart}" -n "${NAMESPACE}" --kube-version "${KUBE_VERSION}" \
  -f "${here}/manifests-values.yaml" --output-dir "${tmp}/manifests" >/dev/null
rendered="${tmp}/manifests/tensor-fusion/templates"
if [[ "${1:-}" == "--update" ]]; then
  rm -rf "${out}" && mkdir -p "${out}" && cp "${rendered}"/*.yaml "${out}/"
  echo "deploy/manifests re-rendered"
elif ! diff -ru "${out}" "${rendered}"; then
  echo "deploy/manifests is stale: run deploy/check.sh --update and commit" >&2
  exit 1
fi
echo "deploy check: ok"
