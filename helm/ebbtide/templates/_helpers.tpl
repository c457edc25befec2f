{{/* Names, labels and the pieces the controller and the agent share. */}}

{{- define "ebbtide.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "ebbtide.fullname" -}}
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

{{- define "ebbtide.agentName" -}}
{{- printf "%s-agent" (include "ebbtide.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "ebbtide.serviceAccountName" -}}
{{- default (include "ebbtide.fullname" .) .Values.serviceAccount.name }}
{{- end }}

{{- define "ebbtide.leaseName" -}}
{{- default (include "ebbtide.fullname" .) .Values.controller.leaseName }}
{{- end }}

{{- define "ebbtide.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "ebbtide.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: ebbtide
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of one component: (dict "ctx" $ "component" "controller") */}}
{{- define "ebbtide.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ebbtide.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "ebbtide.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s:%s@%s" .Values.image.repository $tag .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/* Pod-level security: non-root unless the caller passes root=true (agent pod attribution). */}}
{{- define "ebbtide.podSecurityContext" -}}
{{- if .root }}
runAsNonRoot: false
runAsUser: 0
runAsGroup: 0
{{- else }}
runAsNonRoot: true
{{- with .ctx.Values.runAsUser }}
runAsUser: {{ . }}
{{- end }}
{{- with .ctx.Values.runAsGroup }}
runAsGroup: {{ . }}
fsGroup: {{ . }}
{{- end }}
{{- end }}
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* Container-level security: the same on every container; root=true only changes the uid. */}}
{{- define "ebbtide.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
privileged: false
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- if .root }}
runAsNonRoot: false
runAsUser: 0
{{- else }}
runAsNonRoot: true
{{- with .ctx.Values.runAsUser }}
runAsUser: {{ . }}
{{- end }}
{{- end }}
{{- end }}

{{/* Kafka connection settings, the same variables for `ebbtide run` and `ebbtide agent`. */}}
{{- define "ebbtide.kafkaEnv" -}}
{{- $k := .Values.kafka }}
- name: EBBTIDE_KAFKA__BOOTSTRAP
  value: {{ $k.bootstrap | quote }}
- name: EBBTIDE_KAFKA__GPU_TOPIC
  value: {{ $k.topics.gpu | quote }}
- name: EBBTIDE_KAFKA__SECURITY_PROTOCOL
  value: {{ $k.securityProtocol | quote }}
{{- if $k.sasl.enabled }}
- name: EBBTIDE_KAFKA__SASL_MECHANISM
  value: {{ $k.sasl.mechanism | quote }}
- name: EBBTIDE_KAFKA__SASL_USERNAME
  value: {{ $k.sasl.username | quote }}
- name: EBBTIDE_KAFKA__SASL_PASSWORD_FILE
  value: /etc/ebbtide/kafka-sasl/password
{{- end }}
{{- if and $k.tls.enabled $k.tls.secretName }}
{{- if $k.tls.caKey }}
- name: EBBTIDE_KAFKA__SSL_CAFILE
  value: /etc/ebbtide/kafka-tls/ca.crt
{{- end }}
{{- if and $k.tls.certKey $k.tls.keyKey }}
- name: EBBTIDE_KAFKA__SSL_CERTFILE
  value: /etc/ebbtide/kafka-tls/tls.crt
- name: EBBTIDE_KAFKA__SSL_KEYFILE
  value: /etc/ebbtide/kafka-tls/tls.key
{{- end }}
{{- end }}
{{- end }}

{{- define "ebbtide.kafkaVolumeMounts" -}}
{{- if .Values.kafka.sasl.enabled }}
- name: kafka-sasl
  mountPath: /etc/ebbtide/kafka-sasl
  readOnly: true
{{- end }}
{{- if and .Values.kafka.tls.enabled .Values.kafka.tls.secretName }}
- name: kafka-tls
  mountPath: /etc/ebbtide/kafka-tls
  readOnly: true
{{- end }}
{{- end }}

{{- define "ebbtide.kafkaVolumes" -}}
{{- $k := .Values.kafka }}
{{- if $k.sasl.enabled }}
- name: kafka-sasl
  secret:
    secretName: {{ $k.sasl.passwordSecret.name }}
    defaultMode: 0440
    items:
      - key: {{ $k.sasl.passwordSecret.key }}
        path: password
{{- end }}
{{- if and $k.tls.enabled $k.tls.secretName }}
- name: kafka-tls
  secret:
    secretName: {{ $k.tls.secretName }}
    defaultMode: 0440
    items:
      {{- if $k.tls.caKey }}
      - key: {{ $k.tls.caKey }}
        path: ca.crt
      {{- end }}
      {{- if and $k.tls.certKey $k.tls.keyKey }}
      - key: {{ $k.tls.certKey }}
        path: tls.crt
      - key: {{ $k.tls.keyKey }}
        path: tls.key
      {{- end }}
{{- end }}
{{- end }}

{{/* The label selector the alerts and the dashboard use for this release's metrics. */}}
{{- define "ebbtide.metricsSelector" -}}
job="{{ include "ebbtide.fullname" . }}",namespace="{{ .Release.Namespace }}"
{{- end }}

{{- /*
The policy files the controller reads: `policies`, which replace `defaultPolicies` unless
`mergeDefaultPolicies` (or unless `policies` is empty). The controller merges several files into
one policy: pools and services are unions by name, protectedNamespaces is concatenated, and any
other spec key defined twice is a conflict it refuses to start with; such a merge fails here, at
install time, naming both files.
*/}}
{{- define "ebbtide.policies" -}}
{{- $files := dict -}}
{{- if or (not .Values.policies) .Values.mergeDefaultPolicies -}}
{{- range $file, $doc := .Values.defaultPolicies }}{{ if $doc }}{{ $_ := set $files $file $doc }}{{ end }}{{ end -}}
{{- end -}}
{{- range $file, $doc := .Values.policies }}{{ if $doc }}{{ $_ := set $files $file $doc }}{{ end }}{{ end -}}
{{- if not $files -}}
{{- fail "policies: no policy file (set policies, or keep defaultPolicies)" -}}
{{- end -}}
{{- $seen := dict -}}
{{- range $file := keys $files | sortAlpha -}}
{{- range $key, $value := (get $files $file).spec | default dict -}}
{{- $paths := list (printf "spec.%s" $key) -}}
{{- if has $key (list "pools" "services") -}}
{{- $paths = list -}}
{{- range $name, $_ := $value }}{{ $paths = append $paths (printf "spec.%s.%s" $key $name) }}{{ end -}}
{{- else if eq $key "protectedNamespaces" -}}
{{- $paths = list -}}
{{- end -}}
{{- range $path := $paths -}}
{{- if hasKey $seen $path -}}
{{- fail (printf "policies: %s is defined in both %s and %s, so the controller would refuse to start; your policies replace defaultPolicies unless mergeDefaultPolicies is true" $path (get $seen $path) $file) -}}
{{- end -}}
{{- $_ := set $seen $path $file -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toYaml $files -}}
{{- end -}}
