{{/* Labels on every object; `component` is operator, driver-agent or monitoring. */}}
{{- define "switchyard.labels" -}}
app.kubernetes.io/part-of: switchyard
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
app.kubernetes.io/component: {{ .component }}
{{- if .name }}
app.kubernetes.io/name: {{ .name }}
{{- end }}
{{- end }}

{{- define "switchyard.image" -}}
{{ .image.repository }}:{{ .image.tag | default .root.Chart.AppVersion }}
{{- end }}

{{/* The agent's service account as the API server names it in request.userInfo.username. */}}
{{- define "switchyard.agentUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:switchyard-driver-agent
{{- end }}
