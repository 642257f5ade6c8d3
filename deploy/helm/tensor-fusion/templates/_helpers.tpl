{{/* Common labels; component is one of scheduler, webhook, device-plugin. */}}
{{- define "tf.labels" -}}
app.kubernetes.io/name: tensor-fusion
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "tf.selector" -}}
app.kubernetes.io/name: tensor-fusion
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "tf.image" -}}
{{ .image.repository }}:{{ .image.tag | default .root.Chart.AppVersion }}
{{- end }}

{{/* The API server's user name of one of our service accounts. */}}
{{- define "tf.user" -}}
system:serviceaccount:{{ .root.Release.Namespace }}:{{ .sa }}
{{- end }}

{{/* A CEL list literal of the users allowed to write one component's annotations. */}}
{{- define "tf.users" -}}
{{- $users := list (include "tf.user" .) -}}
{{- range .extra }}{{ $users = append $users . }}{{ end -}}
[{{ range $i, $u := $users }}{{ if $i }}, {{ end }}'{{ $u }}'{{ end }}]
{{- end }}

{{- define "tf.webhookService" -}}
{{ .Release.Name }}-webhook
{{- end }}

{{/* The GPU catalog (values gpuCatalog): its ConfigMap, and the directory the binaries mount it at. */}}
{{- define "tf.gpuCatalogName" -}}
{{ .Release.Name }}-gpu-catalog
{{- end }}

{{- define "tf.gpuCatalogDir" -}}
/etc/tensor-fusion/gpu-catalog
{{- end }}
