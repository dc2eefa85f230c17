{{/* The chart name, or nameOverride. */}}
{{- define "twb.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Resource names: fullnameOverride, else the release name if it contains the chart name, else
<release>-<chart>. */}}
{{- define "twb.fullname" -}}
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

{{- define "twb.selectorLabels" -}}
app.kubernetes.io/name: {{ include "twb.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "twb.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "twb.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "twb.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "twb.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "twb.configMapName" -}}
{{- default (printf "%s-config" (include "twb.fullname" .)) .Values.config.existingConfigMap }}
{{- end }}

{{/* What the bridge reads: the configuration file in /etc/bridge, or with config.extraConfigMaps
the directory /etc/bridge itself (every *.yaml / *.yml file of the ConfigMaps, merged). */}}
{{- define "twb.configPath" -}}
{{- if .Values.config.extraConfigMaps }}
{{- print "/etc/bridge" }}
{{- else }}
{{- printf "/etc/bridge/%s" .Values.config.key }}
{{- end }}
{{- end }}

{{- define "twb.image" -}}
{{- $image := .Values.image }}
{{- if $image.digest }}
{{- printf "%s@%s" $image.repository $image.digest }}
{{- else }}
{{- printf "%s:%s" $image.repository (default .Chart.AppVersion $image.tag) }}
{{- end }}
{{- end }}

{{/* Checks across values, run by the Deployment template. */}}
{{- define "twb.validate" -}}
{{- $bridge := .Values.config.bridge }}
{{- if not .Values.config.existingConfigMap }}
{{- $grace := float64 ((($bridge).delivery).shutdown_grace_seconds | default 20) }}
{{- if le (float64 .Values.terminationGracePeriodSeconds) (addf $grace 10) }}
{{- fail (printf "terminationGracePeriodSeconds (%v) must exceed config.bridge.delivery.shutdown_grace_seconds (%v) plus the producer flush (10 s)" .Values.terminationGracePeriodSeconds $grace) }}
{{- end }}
{{- $port := int ((($bridge).metrics).port | default 9464) }}
{{- if ne $port (int .Values.service.port) }}
{{- fail (printf "service.port (%v) must equal config.bridge.metrics.port (%v)" .Values.service.port $port) }}
{{- end }}
{{- if .Values.keda.enabled }}
{{- $partitions := int ((($bridge).topics).partitions | default 0) }}
{{- if and $partitions (gt (int .Values.keda.maxReplicaCount) $partitions) }}
{{- fail (printf "keda.maxReplicaCount (%v) exceeds config.bridge.topics.partitions (%v): the extra replicas would get no partition" .Values.keda.maxReplicaCount $partitions) }}
{{- end }}
{{- end }}
{{- end }}
{{- with .Values.config.extraConfigMaps }}
{{- if not (or (hasSuffix ".yaml" $.Values.config.key) (hasSuffix ".yml" $.Values.config.key)) }}
{{- fail (printf "config.key (%s) must end in .yaml or .yml with config.extraConfigMaps: the bridge reads only such files of the directory" $.Values.config.key) }}
{{- end }}
{{- if has (include "twb.configMapName" $) . }}
{{- fail (printf "config.extraConfigMaps names %s, the configuration's own ConfigMap" (include "twb.configMapName" $)) }}
{{- end }}
{{- end }}
{{- if and .Values.keda.enabled (gt (int .Values.replicaCount) (int .Values.keda.maxReplicaCount)) }}
{{- fail "replicaCount (KEDA's minReplicaCount) exceeds keda.maxReplicaCount" }}
{{- end }}
{{- end }}
