{{- /* The serving certificate of one of our HTTPS servers (the webhook, the metrics API) and the caBundle
the API server trusts it by, one way per tls.mode: helm (a CA and a certificate generated at install,
kept on upgrades through lookup), cert-manager (a Certificate from tls.certManager.issuerRef, else
from a self-signed Issuer of its own; cert-manager's cainjector fills in the caBundle, asked by the
annotation cert-manager.io/inject-ca-from: <namespace>/<name> on the object that holds it) or provided (your Secret tls.secretName and your caBundle).

Arguments: root, component, values (the values' section, for messages), tls (its tls block), service
(the Service the certificate names), name (of the Certificate), issuer (the self-signed Issuer's name), out
(a dict).
Renders the Secret or the cert-manager objects, each followed by ---, and sets out.caBundle: generated
in this one call, so the Secret and the caBundle come from the same CA. */ -}}
{{- define "tf.servingTLS" }}
{{- $tls := .tls }}
{{- $labels := dict "root" .root "component" .component }}
{{- $svc := .service }}
{{- $ns := .root.Release.Namespace }}
{{- $caBundle := $tls.caBundle }}
{{- if eq $tls.mode "helm" }}
{{- $existing := lookup "v1" "Secret" $ns $tls.secretName }}
{{- $crt := "" }}{{ $key := "" }}
{{- if and $existing (index ($existing.data | default dict) "ca.crt") }}
{{- $caBundle = index $existing.data "ca.crt" }}
{{- $crt = index $existing.data "tls.crt" }}
{{- $key = index $existing.data "tls.key" }}
{{- else }}
{{- $ca := genCA (printf "tensor-fusion-%s-ca" .component) (int $tls.validityDays) }}
{{- $cert := genSignedCert (printf "%s.%s.svc" $svc $ns) nil (list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns)) (int $tls.validityDays) $ca }}
{{- $caBundle = $ca.Cert | b64enc }}
{{- $crt = $cert.Cert | b64enc }}
{{- $key = $cert.Key | b64enc }}
{{- end }}
apiVersion: v1
kind: Secret
metadata:
  name: {{ $tls.secretName }}
  namespace: {{ $ns }}
  labels: {{- include "tf.labels" $labels | nindent 4 }}
type: kubernetes.io/tls
data:
  ca.crt: {{ $caBundle }}
  tls.crt: {{ $crt }}
  tls.key: {{ $key }}
---
{{- else if eq $tls.mode "cert-manager" }}
{{- if not $tls.certManager.issuerRef }}
apiVersion: cert-manager.io/v1
kind: Issuer
metadata:
  name: {{ .issuer }}
  namespace: {{ $ns }}
  labels: {{- include "tf.labels" $labels | nindent 4 }}
spec:
  selfSigned: {}
---
{{- end }}
apiVersion: cert-manager.io/v1
kind: Certificate
metadata:
  name: {{ .name }}
  namespace: {{ $ns }}
  labels: {{- include "tf.labels" $labels | nindent 4 }}
spec:
  secretName: {{ $tls.secretName }}
  dnsNames:
    - {{ $svc }}.{{ $ns }}.svc
    - {{ $svc }}.{{ $ns }}.svc.cluster.local
  issuerRef: {{- toYaml ($tls.certManager.issuerRef | default (dict "name" .issuer "kind" "Issuer")) | nindent 4 }}
---
{{- else if ne $tls.mode "provided" }}
{{- fail (printf "%s.tls.mode must be helm, cert-manager or provided" .values) }}
{{- end }}
{{- $_ := set .out "caBundle" $caBundle }}
{{- end }}
