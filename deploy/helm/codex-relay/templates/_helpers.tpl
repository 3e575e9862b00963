{{/* The chart's name. */}}
{{- define "codex-relay.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name: the prefix of every object's name. Short enough
for the "-replicas" suffix to fit in 63 characters. */}}
{{- define "codex-relay.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 54 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 54 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 54 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "codex-relay.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "codex-relay.labels" -}}
helm.sh/chart: {{ include "codex-relay.chart" . }}
{{ include "codex-relay.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "codex-relay.selectorLabels" -}}
app.kubernetes.io/name: {{ include "codex-relay.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "codex-relay.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "codex-relay.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "codex-relay.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/* The chart's own Secret, holding the values given in values.yaml. */}}
{{- define "codex-relay.secretName" -}}
{{- include "codex-relay.fullname" . }}
{{- end }}

{{/* secretRef returns "name/key" of where a secret is: the existing Secret, or
the chart's. Called with (list $ .Values.secretKey "secret-key"). */}}
{{- define "codex-relay.secretRef" -}}
{{- $root := index . 0 }}
{{- $v := index . 1 }}
{{- $key := index . 2 }}
{{- if $v.existingSecret }}
{{- printf "%s/%s" $v.existingSecret ($v.existingSecretKey | default $key) }}
{{- else }}
{{- printf "%s/%s" (include "codex-relay.secretName" $root) $key }}
{{- end }}
{{- end }}

{{/* Whether the admin token is configured (it is optional). */}}
{{- define "codex-relay.hasAdminToken" -}}
{{- if or .Values.adminToken.existingSecret .Values.adminToken.value }}true{{ end }}
{{- end }}

{{/* The pod's termination grace: preStop + drain + a margin, unless set. */}}
{{- define "codex-relay.terminationGrace" -}}
{{- $drain := add (int .Values.drain.preStopSeconds) (int .Values.drain.timeoutSeconds) }}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds }}
{{- add $drain 15 }}
{{- else if le (int .Values.terminationGracePeriodSeconds) $drain }}
{{- fail (printf "terminationGracePeriodSeconds (%d) must be longer than drain.preStopSeconds + drain.timeoutSeconds (%d): Kubernetes would kill turns the relay is finishing" (int .Values.terminationGracePeriodSeconds) $drain) }}
{{- else }}
{{- int .Values.terminationGracePeriodSeconds }}
{{- end }}
{{- end }}
