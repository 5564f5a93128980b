{{/* Chart name, overridable. */}}
{{- define "servegraph-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Object names: "servegraph-operator" for a release of that name, as with kustomize. */}}
{{- define "servegraph-operator.fullname" -}}
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

{{- define "servegraph-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "servegraph-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
A shard's pods: not matched by the main instance's selector (its Service, PodDisruptionBudget
and anti-affinity), so each shard is its own set. Usage: include ... (list . "name")
*/}}
{{- define "servegraph-operator.shardSelectorLabels" -}}
{{- $ctx := index . 0 -}}
app.kubernetes.io/name: {{ include "servegraph-operator.name" $ctx }}-shard
app.kubernetes.io/instance: {{ $ctx.Release.Name }}
servegraph.io/shard: {{ index . 1 }}
{{- end }}

{{- define "servegraph-operator.labels" -}}
{{ include "servegraph-operator.selectorLabels" . }}
{{ include "servegraph-operator.commonLabels" . }}
{{- end }}

{{- define "servegraph-operator.commonLabels" -}}
app.kubernetes.io/part-of: servegraph
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{- define "servegraph-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "servegraph-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "servegraph-operator.eventsTokenSecret" -}}
{{- default (printf "%s-events-token" (include "servegraph-operator.fullname" .)) .Values.events.tokenSecret.name }}
{{- end }}

{{- define "servegraph-operator.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
The rules of one of config/rbac's roles: files/ holds symlinks to them, so the
chart and kustomize grant exactly the same rules. Usage:
  include "servegraph-operator.rulesOf" (list . "files/role.yaml")
*/}}
{{- define "servegraph-operator.rulesOf" -}}
{{- $ctx := index . 0 }}
{{- $file := index . 1 }}
{{- $role := $ctx.Files.Get $file | fromYaml }}
{{- if or (hasKey $role "Error") (not $role.rules) }}
{{- fail (printf "%s (a link into config/rbac/) is missing or has no rules" $file) }}
{{- end }}
{{- toYaml $role.rules }}
{{- end }}
