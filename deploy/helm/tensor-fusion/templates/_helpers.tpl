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

{{/* The Kubernetes version rendered for (the cluster's, or --kube-version), without vendor suffixes:
v1.30.4-eks-1234 and v1.30.4+k3s1 give v1.30.4. */}}
{{- define "tf.kubeVersion" -}}
{{- $v := semver .Capabilities.KubeVersion.Version -}}
v{{ $v.Major }}.{{ $v.Minor }}.{{ $v.Patch }}
{{- end }}

{{/* kube-scheduler: images.kubeScheduler.tag, else the cluster's own version (no version skew). */}}
{{- define "tf.kubeSchedulerImage" -}}
{{- $image := .Values.images.kubeScheduler -}}
{{ $image.repository }}:{{ $image.tag | default (include "tf.kubeVersion" .) }}
{{- end }}

{{/* The oldest Kubernetes the chart installs on: ValidatingAdmissionPolicy v1 is GA from 1.30. Enforced
when helm talks to a cluster (its API list names kinds, e.g. v1/Pod); a render without one (helm
template, which defaults to Kubernetes v1.20.0) is not refused. */}}
{{- define "tf.minKubeVersion" -}}1.30.0{{- end }}
{{- define "tf.checkKubeVersion" -}}
{{- if and (.Capabilities.APIVersions.Has "v1/Pod") (semverCompare (printf "<%s-0" (include "tf.minKubeVersion" .)) .Capabilities.KubeVersion.Version) }}
{{- fail (printf "tensor-fusion needs Kubernetes >= %s (ValidatingAdmissionPolicy v1); the cluster runs %s" (include "tf.minKubeVersion" .) .Capabilities.KubeVersion.Version) }}
{{- end }}
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

{{/* The device plugins' headless metrics Service: Prometheus scrapes /metrics and tf-metrics finds /usage through it. */}}
{{- define "tf.pluginMetricsService" -}}
{{ .Release.Name }}-device-plugin-metrics
{{- end }}

{{/* The GPU catalog (values gpuCatalog): its ConfigMap, and the directory the binaries mount it at. */}}
{{- define "tf.gpuCatalogName" -}}
{{ .Release.Name }}-gpu-catalog
{{- end }}

{{- define "tf.gpuCatalogDir" -}}
/etc/tensor-fusion/gpu-catalog
{{- end }}
{{- /* Our pod resources as a CEL list (vgpu/names.py: RESOURCE_VGPU and NODE_RESOURCES). */ -}}
{{- define "tf.resourceNames" -}}
['tensor-fusion.ai/vgpu', 'tensor-fusion.ai/milli-tflops', 'tensor-fusion.ai/vram']
{{- end }}
