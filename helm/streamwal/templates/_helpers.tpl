{{/* Names, labels and shared pieces of the streamwal chart. */}}

{{- define "streamwal.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "streamwal.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "streamwal.selectorLabels" -}}
app.kubernetes.io/name: {{ include "streamwal.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "streamwal.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "streamwal.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: streamwal
{{- end -}}

{{- define "streamwal.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* Pod-level security: non-root, fixed ids, the runtime's seccomp profile. */}}
{{- define "streamwal.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.securityContext.runAsUser }}
runAsGroup: {{ .Values.securityContext.runAsGroup }}
fsGroup: {{ .Values.securityContext.fsGroup }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Container-level security: read-only root filesystem, no escalation, no capabilities. */}}
{{- define "streamwal.containerSecurityContext" -}}
runAsNonRoot: true
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
capabilities:
  drop: [ALL]
{{- end -}}

{{- define "streamwal.nodeHeadless" -}}
{{ include "streamwal.fullname" . }}-node-headless
{{- end -}}

{{/* The coord's static node list, ID=HOST:PORT, from the StatefulSet's stable DNS names. */}}
{{- define "streamwal.coordNodes" -}}
{{- $full := include "streamwal.fullname" . -}}
{{- $svc := include "streamwal.nodeHeadless" . -}}
{{- $nodes := list -}}
{{- range $i := until (int .Values.node.replicas) -}}
{{- $nodes = append $nodes (printf "%d=%s-node-%d.%s.%s.svc:%d" $i $full $i $svc $.Release.Namespace (int $.Values.node.grpcPort)) -}}
{{- end -}}
{{- join "," $nodes -}}
{{- end -}}

{{/* Alerting rules, shared by the PrometheusRule and by tests (promtool check rules). */}}
{{- define "streamwal.alertRules" -}}
{{- $r := .Values.metrics.prometheusRule -}}
- name: streamwal.rules
  rules:
    - alert: StreamwalPChannelNotReady
      expr: max by (pchannel, namespace) (streamwal_pchannel_info{state!="assigned"}) == 1
      for: {{ $r.notReadyFor }}
      labels:
        severity: critical
      annotations:
        summary: "pchannel {{`{{ $labels.pchannel }}`}} is not served"
        description: >-
          pchannel {{`{{ $labels.pchannel }}`}} has not been assigned to a streaming node for
          {{ $r.notReadyFor }}: producers and consumers of it fail. See the Ready condition in
          `kubectl describe pch {{`{{ $labels.pchannel }}`}}`.
    - alert: StreamwalFailoverStorm
      expr: sum by (namespace) (increase(streamwal_coord_failovers_total[{{ $r.failoverStorm.window }}])) > {{ $r.failoverStorm.failovers }}
      labels:
        severity: warning
      annotations:
        summary: "more than {{ $r.failoverStorm.failovers }} pchannel failovers in {{ $r.failoverStorm.window }}"
        description: >-
          Streaming nodes keep being lost ({{`{{ $value | humanize }}`}} failovers). Check node
          pod restarts, readiness probes and resource limits.
    - alert: StreamwalConsumerLag
      expr: max by (pchannel, namespace) (streamwal_consumer_lag_messages) > {{ int $r.consumerLag.messages }}
      for: {{ $r.consumerLag.for }}
      labels:
        severity: warning
      annotations:
        summary: "consumers of {{`{{ $labels.pchannel }}`}} lag {{`{{ $value | humanize }}`}} messages"
        description: >-
          The slowest consumer of pchannel {{`{{ $labels.pchannel }}`}} has been more than
          {{ int $r.consumerLag.messages }} messages behind the log end for {{ $r.consumerLag.for }}.
    - alert: StreamwalDiskFilling
      expr: |
        (
          kubelet_volume_stats_available_bytes{persistentvolumeclaim=~"data-{{ include "streamwal.fullname" . }}-node-.*"}
            / kubelet_volume_stats_capacity_bytes{persistentvolumeclaim=~"data-{{ include "streamwal.fullname" . }}-node-.*"}
        ) < {{ $r.diskFilling.freeRatio }}
        and
        predict_linear(kubelet_volume_stats_available_bytes{persistentvolumeclaim=~"data-{{ include "streamwal.fullname" . }}-node-.*"}[6h], {{ $r.diskFilling.predictHours }} * 3600) < 0
      for: 15m
      labels:
        severity: warning
      annotations:
        summary: "volume {{`{{ $labels.persistentvolumeclaim }}`}} fills up within {{ $r.diskFilling.predictHours }}h"
        description: >-
          Less than {{ mulf $r.diskFilling.freeRatio 100 }}% free and filling. Lower PChannel
          spec.retention, or grow node.persistence.size.
{{- end -}}
