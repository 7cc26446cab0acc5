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

{{/* [<registry>/]<repository>:<tag>[@<digest>]: registry is image.registry, else global.imageRegistry;
tag defaults to the chart's appVersion. */}}
{{- define "switchyard.image" -}}
{{- $registry := .image.registry | default (.root.Values.global | default dict).imageRegistry -}}
{{- with $registry }}{{ . }}/{{ end -}}
{{ .image.repository }}:{{ .image.tag | default .root.Chart.AppVersion }}
{{- with .image.digest }}@{{ . }}{{ end }}
{{- end }}

{{/* The agent's service account as the API server names it in request.userInfo.username. */}}
{{- define "switchyard.agentUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:switchyard-driver-agent
{{- end }}

{{/* The operator's service account as the API server names it in request.userInfo.username. */}}
{{- define "switchyard.operatorUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:switchyard-operator
{{- end }}
