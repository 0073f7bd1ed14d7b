{{/* The objects' common name: the release's, "plexus" for a release named plexus. */}}
{{- define "plexus.name" -}}
{{- if eq .Release.Name "plexus" -}}plexus{{- else -}}{{ printf "%s-plexus" .Release.Name | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- end -}}

{{- define "plexus.labels" -}}
app.kubernetes.io/name: plexus
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "plexus.selector" -}}
app.kubernetes.io/name: plexus
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "plexus.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The meta config: what the chart sets, then the admin's keys. */}}
{{- define "plexus.metaConfig" -}}
{{- $plugin := dict "type" "plexus" "kubeconfig" (printf "%s/plexus.d/plexus.kubeconfig" .Values.cni.confDir) "binDir" .Values.cni.binDir -}}
{{- if eq .Values.mode "daemon" -}}
{{- $_ := set $plugin "daemonSocket" .Values.daemon.socket -}}
{{- end -}}
{{- if .Values.dra.enabled -}}
{{- $_ := set $plugin "draClaimsDir" .Values.dra.claimsDir -}}
{{- end -}}
{{- $plugin = merge (deepCopy .Values.metaConfig.keys) $plugin -}}
{{- dict "cniVersion" .Values.metaConfig.cniVersion "name" "plexus" "plugins" (list $plugin) | toPrettyJson -}}
{{- end -}}

{{- define "plexus.resources" -}}
{{- if .Values.resources -}}
{{ toYaml .Values.resources }}
{{- else if eq .Values.mode "daemon" -}}
requests: {cpu: 50m, memory: 64Mi}
limits: {memory: 256Mi}
{{- else -}}
requests: {cpu: 10m, memory: 16Mi}
limits: {memory: 64Mi}
{{- end -}}
{{- end -}}
