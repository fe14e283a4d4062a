{{- define "oceanus.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "oceanus.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "oceanus.labels" -}}
{{ include "oceanus.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "oceanus.repository" -}}
{{- $r := .Values.modelRepository -}}
{{- if $r.url -}}
{{- $r.url -}}
{{- else if or $r.pvc.claimName $r.image.repository -}}
{{- $r.mountPath -}}
{{- else -}}
{{- fail "set one of modelRepository.url, modelRepository.pvc.claimName, modelRepository.image.repository" -}}
{{- end -}}
{{- end -}}
