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

{{/* The ServiceAccount the operator runs as. */}}
{{- define "streamwal.serviceAccountName" -}}
{{- .Values.serviceAccount.name | default (printf "%s-operator" (include "streamwal.fullname" .)) -}}
{{- end -}}

{{/* TLS Secrets: the user's (tls.issuer=secrets) or those the chart or cert-manager
     fills (<fullname>-tls-{ca,node,coord,client}). cert-manager puts ca.crt in every
     certificate's Secret, so the node's serves as the CA Secret there.
     Call with (dict "root" $ "part" "ca|node|coord|client"). */}}
{{- define "streamwal.tlsSecret" -}}
{{- $tls := .root.Values.tls -}}
{{- if eq $tls.issuer "secrets" -}}
{{- index $tls (printf "%sSecret" .part) -}}
{{- else if and (eq $tls.issuer "cert-manager") (eq .part "ca") -}}
{{- include "streamwal.fullname" .root }}-tls-node
{{- else -}}
{{- include "streamwal.fullname" .root }}-tls-{{ .part }}
{{- end -}}
{{- end -}}

{{/* Non-empty when `helm test` has a certificate to call with (or needs none). */}}
{{- define "streamwal.testPod" -}}
{{- if or (not .Values.tls.enabled) (ne .Values.tls.issuer "secrets") .Values.tls.clientSecret -}}
yes
{{- end -}}
{{- end -}}

{{/* TLS: the name server certificates carry. */}}
{{- define "streamwal.tlsServerName" -}}
{{- .Values.tls.serverName | default (include "streamwal.fullname" .) -}}
{{- end -}}

{{/* The access file (docs/security.md): the release's own components get the cluster
     role (their certificates' names: access.clusterIdentities, by default the names the
     chart's certificates carry), then the user's access.identities. */}}
{{- define "streamwal.accessFile" -}}
{{- $full := include "streamwal.fullname" . -}}
{{- $cluster := .Values.access.clusterIdentities | default (list (printf "%s-node" $full) (printf "%s-coord" $full)) -}}
{{- $identities := prepend .Values.access.identities (dict "names" $cluster "roles" (list "cluster")) -}}
{{- toYaml (dict "identities" $identities) -}}
{{- end -}}

{{/* The server's --access-file flag, with TLS on. */}}
{{- define "streamwal.accessArg" -}}
{{- if .Values.tls.enabled }}
- --access-file=/etc/streamwal/access/access.yaml
{{- end }}
{{- end -}}

{{/* TLS environment of a container (STREAMWAL_TLS_*, read by streamwal.transport). */}}
{{- define "streamwal.tlsEnv" -}}
{{- if .root.Values.tls.enabled }}
- name: STREAMWAL_TLS_CA
  value: /etc/streamwal/tls/ca/ca.crt
- name: STREAMWAL_TLS_CERT
  value: /etc/streamwal/tls/cert/tls.crt
- name: STREAMWAL_TLS_KEY
  value: /etc/streamwal/tls/cert/tls.key
- name: STREAMWAL_TLS_SERVER_NAME
  value: {{ include "streamwal.tlsServerName" .root | quote }}
{{- end }}
{{- end -}}

{{- define "streamwal.tlsVolumeMounts" -}}
{{- if .Values.tls.enabled }}
- name: tls-ca
  mountPath: /etc/streamwal/tls/ca
  readOnly: true
- name: tls-cert
  mountPath: /etc/streamwal/tls/cert
  readOnly: true
- name: access
  mountPath: /etc/streamwal/access
  readOnly: true
{{- end }}
{{- end -}}

{{/* call with (dict "root" $ "part" "node|coord|client") */}}
{{- define "streamwal.tlsVolumes" -}}
{{- if .root.Values.tls.enabled }}
- name: tls-ca
  secret:
    secretName: {{ include "streamwal.tlsSecret" (dict "root" .root "part" "ca") }}
    defaultMode: 0440
    items:
      - {key: ca.crt, path: ca.crt}
- name: tls-cert
  secret:
    secretName: {{ include "streamwal.tlsSecret" . }}
    defaultMode: 0440
    items:
      - {key: tls.crt, path: tls.crt}
      - {key: tls.key, path: tls.key}
- name: access
  configMap:
    name: {{ include "streamwal.fullname" .root }}-access
{{- end }}
{{- end -}}

{{/* Probes of a gRPC port: the native gRPC probe, or a TCP connect under TLS (the kubelet's
     gRPC probe speaks no TLS; the port is bound once the process serves). */}}
{{- define "streamwal.grpcProbe" -}}
{{- if .root.Values.tls.enabled }}
tcpSocket:
  port: {{ .port }}
{{- else }}
grpc:
  port: {{ .port }}
{{- end }}
{{- end -}}

{{/* Scheduling keys every component takes: call with the component's values. */}}
{{- define "streamwal.scheduling" -}}
{{- with .priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Whether to create a Prometheus Operator object: "on" or "". `enabled` true fails
     where the cluster lacks the API; auto follows it. Call with
     (dict "root" $ "kind" "ServiceMonitor" "enabled" <value> "key" "metrics.serviceMonitor.enabled") */}}
{{- define "streamwal.monitoring" -}}
{{- $has := .root.Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" .kind) -}}
{{- $want := toString .enabled -}}
{{- if eq $want "true" -}}
{{- if not $has -}}
{{- fail (printf "%s=true, but this cluster does not serve monitoring.coreos.com/v1 %s (the Prometheus Operator's CRDs): install them first, or set %s=auto (created once they exist) or false" .key .kind .key) -}}
{{- end -}}
on
{{- else if and (eq $want "auto") $has -}}
on
{{- end -}}
{{- end -}}

{{/* The dashboard ConfigMap's labels, as `key=value` for NOTES. */}}
{{- define "streamwal.dashboardLabel" -}}
{{- $out := list -}}
{{- range $k, $v := .Values.metrics.grafanaDashboard.labels -}}
{{- $out = append $out (printf "%s=%s" $k $v) -}}
{{- end -}}
{{- join "," $out -}}
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
    - alert: StreamwalUncleanFailover
      expr: sum by (namespace) (increase(streamwal_coord_unclean_failovers_total[15m])) > 0
      labels:
        severity: critical
      annotations:
        summary: "a pchannel moved off a lost node without its last records"
        description: >-
          {{`{{ $value | humanize }}`}} pchannel(s) failed over without catch-up: records
          the lost node acknowledged after the new owner's start are stranded on its volume.
          See the UncleanFailover Events (`kubectl get events --field-selector
          reason=UncleanFailover`) and bring the lost node back to read them.
    - alert: StreamwalReplicaLag
      expr: max by (pchannel, namespace) (streamwal_replica_lag) > {{ int $r.replicaLag.messages }}
      for: {{ $r.replicaLag.for }}
      labels:
        severity: warning
      annotations:
        summary: "a follower of {{`{{ $labels.pchannel }}`}} lags {{`{{ $value | humanize }}`}} messages"
        description: >-
          A follower of pchannel {{`{{ $labels.pchannel }}`}} has been more than
          {{ int $r.replicaLag.messages }} messages behind its leader for {{ $r.replicaLag.for }}:
          a leader loss now would wait for it to catch up. Check that node's disk and CPU.
{{- if eq .Values.controller "operator" }}
    - alert: StreamwalPChannelUnderReplicated
      expr: |
        max by (pchannel, namespace) (streamwal_pchannel_replicas_wanted) > 1
          > on (pchannel, namespace)
        count by (pchannel, namespace) (streamwal_replica_role == 1)
      for: {{ $r.underReplicatedFor }}
      labels:
        severity: warning
      annotations:
        summary: "pchannel {{`{{ $labels.pchannel }}`}} is served by fewer nodes than spec.replicas"
        description: >-
          pchannel {{`{{ $labels.pchannel }}`}} wants {{`{{ $value }}`}} replicas but fewer
          nodes serve it, for {{ $r.underReplicatedFor }}: it tolerates fewer node losses
          than declared. See `kubectl describe pch {{`{{ $labels.pchannel }}`}}`.
{{- end }}
    - alert: StreamwalNodeDown
      expr: max by (namespace) (streamwal_coord_nodes_live) < {{ int .Values.node.replicas }}
      for: {{ $r.nodeDownFor }}
      labels:
        severity: warning
      annotations:
        summary: "{{`{{ $value }}`}} of {{ int .Values.node.replicas }} streaming nodes answer"
        description: >-
          Fewer streaming nodes than node.replicas ({{ int .Values.node.replicas }}) answer
          the {{ .Values.controller }}'s probes for {{ $r.nodeDownFor }}: their pchannels
          have failed over or wait. Check `kubectl get pods -l
          app.kubernetes.io/component=streaming-node`.
{{- end -}}
