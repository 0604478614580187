{{- define "monarch-operator.name" -}}{{ .Chart.Name }}{{- end -}}
{{- define "monarch-operator.fullname" -}}{{ .Release.Name | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- define "monarch-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "monarch-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
{{- define "monarch-operator.labels" -}}
{{ include "monarch-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}
{{- define "monarch-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}{{ default (include "monarch-operator.fullname" .) .Values.serviceAccount.name }}{{- else -}}{{ default "default" .Values.serviceAccount.name }}{{- end -}}
{{- end -}}
