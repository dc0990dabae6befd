{{/* Names and labels, as kedacore/charts spell them. */}}
{{- define "keda-gpu-scaler.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "keda-gpu-scaler.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "keda-gpu-scaler.selectorLabels" -}}
app.kubernetes.io/name: {{ include "keda-gpu-scaler.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "keda-gpu-scaler.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "keda-gpu-scaler.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: external-scaler
app.kubernetes.io/part-of: keda-gpu-scaler
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.additionalLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "keda-gpu-scaler.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "keda-gpu-scaler.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "keda-gpu-scaler.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The Secret holding tls.crt, tls.key and ca.crt for the gRPC server. */}}
{{- define "keda-gpu-scaler.tlsSecretName" -}}
{{- if .Values.tls.certManager.enabled }}
{{- printf "%s-server-tls" (include "keda-gpu-scaler.fullname" .) }}
{{- else }}
{{- required "tls.existingSecret is required when tls.enabled is true and tls.certManager.enabled is false" .Values.tls.existingSecret }}
{{- end }}
{{- end }}

{{/*
A flag value as its environment variable wants it: whole numbers without an exponent (values files
give numbers as float64), lists joined with the separator the scaler splits that flag's variable on.
*/}}
{{- define "keda-gpu-scaler.scalar" -}}
{{- if and (kindIs "float64" .) (eq (. | int64 | float64) .) }}{{ . | int64 }}{{ else }}{{ . }}{{ end }}
{{- end }}

{{- define "keda-gpu-scaler.flagValue" -}}
{{- $separators := dict "prometheusHeader" "\n" "exporterSelector" ";" }}
{{- if kindIs "slice" .value }}
{{- $items := list }}
{{- range .value }}{{ $items = append $items (include "keda-gpu-scaler.scalar" .) }}{{ end }}
{{- join (get $separators .name | default ",") $items }}
{{- else }}
{{- include "keda-gpu-scaler.scalar" .value }}
{{- end }}
{{- end }}

{{/* The scaler's own default exporter selectors (--exporter-selector replaces them when given). */}}
{{- define "keda-gpu-scaler.defaultExporterSelectors" -}}
app=nvidia-dcgm-exporter:9400;app.kubernetes.io/name=dcgm-exporter:9400;app.kubernetes.io/name=metrics-exporter,daemonset-name:5000
{{- end }}

{{/* --exporter-selector, or nothing when the scaler's defaults are left as they are. */}}
{{- define "keda-gpu-scaler.exporterSelectors" -}}
{{- $s := .Values.exporterSelectors }}
{{- $list := $s.override | default (splitList ";" (include "keda-gpu-scaler.defaultExporterSelectors" .)) }}
{{- $list = concat $list $s.additional }}
{{- if $s.ack.enabled }}{{ $list = append $list $s.ack.selector }}{{ end }}
{{- if or $s.override $s.additional $s.ack.enabled }}{{ join ";" $list }}{{ end }}
{{- end }}

{{/* What the scaler reads from the Kubernetes API; see manifests/base/clusterrole/clusterrole.yaml. */}}
{{- define "keda-gpu-scaler.targetRules" -}}
# A ScaledObject: its scaleTargetRef and the trigger's metricType; get for one named in a call, list+watch
# of the namespaces holding a followed one (edits count at once, API blips keep the last one read).
- apiGroups: ["keda.sh"]
  resources: ["scaledobjects"]
  verbs: ["get", "list", "watch"]
# The scale target's /scale subresource (status.selector): get only, the scaler never scales.
{{- range .Values.rbac.scaleTargets }}
- apiGroups: {{ toJson .apiGroups }}
  resources: {{ toJson .resources }}
  verbs: ["get"]
{{- end }}
{{- end }}

{{- define "keda-gpu-scaler.gatewayRules" -}}
{{- if .Values.rbac.gateway }}
# Triggers with metric pending or naming inferencePool: the InferencePool (spec.endpointPickerRef) and that Service (spec.selector,
# to find the endpoint picker's pods), followed by name in list+watch caches in the ScaledObject's namespace.
- apiGroups: ["inference.networking.k8s.io"]
  resources: ["inferencepools"]
  verbs: ["list", "watch"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["list", "watch"]
{{- end }}
{{- end }}

{{/* "true" when flags.kubernetes is off: the scaler then makes no Kubernetes API call at all. */}}
{{- define "keda-gpu-scaler.kubernetesOff" -}}
{{- if eq (toString .Values.flags.kubernetes) "off" }}true{{ end }}
{{- end }}

{{/*
"true" when the scaler's own service account token may go to endpoint pickers (over verified HTTPS only):
not with gateway.metricsToken (pickers get that identity's token, never the scaler's), and without
Kubernetes only to the pickers of flags.gatewayUrl.
*/}}
{{- define "keda-gpu-scaler.ownTokenToPickers" -}}
{{- if and (not .Values.gateway.metricsToken.enabled) (or (not (include "keda-gpu-scaler.kubernetesOff" .)) .Values.flags.gatewayUrl) }}true{{ end }}
{{- end }}

{{/* "true" when the scaler's own identity needs `get` on /metrics: what pickers check of its token. */}}
{{- define "keda-gpu-scaler.ownMetricsGrant" -}}
{{- if and .Values.rbac.gateway (include "keda-gpu-scaler.ownTokenToPickers" .) }}true{{ end }}
{{- end }}

{{/* Mount the scaler's own token only where it is used: Kubernetes discovery, or pickers given it. */}}
{{- define "keda-gpu-scaler.automountToken" -}}
{{- if and .Values.serviceAccount.automountServiceAccountToken (or (not (include "keda-gpu-scaler.kubernetesOff" .)) (include "keda-gpu-scaler.ownTokenToPickers" .)) }}true{{ else }}false{{ end }}
{{- end }}

{{- define "keda-gpu-scaler.gatewayMetricsRule" -}}
# What the endpoint picker's authorizer checks (a SubjectAccessReview) before serving its /metrics page
# to the scaler's token; it also lets the scaler read the API server's /metrics (counters, no objects).
- nonResourceURLs: ["/metrics"]
  verbs: ["get"]
{{- end }}

{{- define "keda-gpu-scaler.podRules" -}}
# Pods (target pods, GPU exporter pods) kept in list+watch caches: names, labels, nodes and status.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch"]
{{- end }}

{{- define "keda-gpu-scaler.gatewayTokenName" -}}
{{ include "keda-gpu-scaler.fullname" . }}-epp-metrics
{{- end }}

{{- define "keda-gpu-scaler.gatewayTokenSecret" -}}
{{ .Values.gateway.metricsToken.existingSecret }}
{{- end }}

{{/* The ClusterTriggerAuthentication KEDA reaches the scaler over TLS with: -mtls with a client certificate, -tls with the CA only. */}}
{{- define "keda-gpu-scaler.triggerAuthName" -}}
{{- printf "%s-%s" (include "keda-gpu-scaler.fullname" .) (ternary "mtls" "tls" .Values.tls.mtls.enabled) }}
{{- end }}
