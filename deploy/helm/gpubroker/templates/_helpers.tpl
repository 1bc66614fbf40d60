{{/*
Names. fullname is the release name when it already says gpubroker (so
`helm install gpubroker` makes a Deployment "gpubroker", the name the z2jh
values in deploy/jupyterhub use), else "<release>-gpubroker".
*/}}
{{- define "gpubroker.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpubroker.fullname" -}}
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

{{- define "gpubroker.agentName" -}}
{{- printf "%s-agent" (include "gpubroker.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpubroker.redisName" -}}
{{- printf "%s-redis" (include "gpubroker.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels every object carries: baseLabels next to a selector (which names the
instance), labels everywhere else.
*/}}
{{- define "gpubroker.baseLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/part-of: gpubroker
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "gpubroker.labels" -}}
{{ include "gpubroker.baseLabels" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Selector labels. The broker's pods are app.kubernetes.io/name=gpubroker
(the name the JupyterHub values and the notebooks' NetworkPolicy select);
the agent's gpubroker-agent; the trial Redis gpubroker-redis.
*/}}
{{- define "gpubroker.brokerSelector" -}}
app.kubernetes.io/name: {{ include "gpubroker.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "gpubroker.agentSelector" -}}
app.kubernetes.io/name: {{ include "gpubroker.name" . }}-agent
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "gpubroker.redisSelector" -}}
app.kubernetes.io/name: {{ include "gpubroker.name" . }}-redis
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "gpubroker.brokerImage" -}}
{{- printf "%s:%s" .Values.broker.image.repository (default .Chart.AppVersion .Values.broker.image.tag) }}
{{- end }}

{{- define "gpubroker.agentImage" -}}
{{- printf "%s:%s" .Values.agent.image.repository (default .Chart.AppVersion .Values.agent.image.tag) }}
{{- end }}

{{/* The broker's container port (--listen) and the notebook port of the pods the spawner makes (spawner.DefaultNotebookPort). */}}
{{- define "gpubroker.httpPort" -}}8080{{- end }}
{{- define "gpubroker.notebookPort" -}}8888{{- end }}

{{/* Where the broker mounts its files. */}}
{{- define "gpubroker.profilesDir" -}}/etc/gpubroker/profiles{{- end }}
{{- define "gpubroker.secretsDir" -}}/etc/gpubroker/secrets{{- end }}

{{/*
The Redis to use, as a dict: url, or master and addrs (a comma-separated
list), from redis.url, redis.sentinel or the trial Redis. Exactly one of
them must be set.
*/}}
{{- define "gpubroker.redisURL" -}}
{{- if .Values.redis.inChart.enabled -}}
{{- printf "redis://%s.%s.svc:6379/0" (include "gpubroker.redisName" .) .Release.Namespace -}}
{{- else -}}
{{- .Values.redis.url -}}
{{- end -}}
{{- end }}

{{/*
The public URL: broker.publicURL, else https://<ingress.host> (http:// without
a TLS Secret) when the Ingress is on.
*/}}
{{- define "gpubroker.publicURL" -}}
{{- if .Values.broker.publicURL -}}
{{- .Values.broker.publicURL -}}
{{- else if and .Values.ingress.enabled .Values.ingress.host -}}
{{- printf "%s://%s" (ternary "https" "http" (ne .Values.ingress.tlsSecret "")) .Values.ingress.host -}}
{{- end -}}
{{- end }}

{{/*
Checks across values that the schema cannot word well. Each failure names
the values to change.
*/}}
{{- define "gpubroker.validate" -}}
{{- $redis := 0 }}
{{- if .Values.redis.url }}{{ $redis = add1 $redis }}{{ end }}
{{- if or .Values.redis.sentinel.master .Values.redis.sentinel.addrs }}{{ $redis = add1 $redis }}{{ end }}
{{- if .Values.redis.inChart.enabled }}{{ $redis = add1 $redis }}{{ end }}
{{- if ne $redis 1 }}
{{- fail "redis: set exactly one of redis.url, redis.sentinel (master and addrs) or redis.inChart.enabled=true (trials only)" }}
{{- end }}
{{- if and (or .Values.redis.sentinel.master .Values.redis.sentinel.addrs) (not (and .Values.redis.sentinel.master .Values.redis.sentinel.addrs)) }}
{{- fail "redis.sentinel: set both master and addrs" }}
{{- end }}
{{- if and .Values.redis.inChart.enabled .Values.redis.password.name }}
{{- fail "redis.password: the trial Redis (redis.inChart) has no password; leave redis.password.name empty or use an external Redis" }}
{{- end }}
{{- if not .Values.broker.oidc.issuer }}
{{- fail "broker.oidc.issuer is required: the OIDC issuer URL whose tokens the broker accepts" }}
{{- end }}
{{- if not .Values.broker.oidc.audience }}
{{- fail "broker.oidc.audience is required: the audience (client id) tokens must carry" }}
{{- end }}
{{- if and (eq .Values.notebooks.mode "host") (not .Values.notebooks.domain) }}
{{- fail "notebooks.domain is required with notebooks.mode=host (e.g. nb.example.org, served as *.nb.example.org); or set notebooks.mode=path" }}
{{- end }}
{{- if and .Values.broker.hub.url (not .Values.broker.hub.apiToken.name) }}
{{- fail "broker.hub.apiToken.name is required with broker.hub.url: the Secret holding a hub API token with users:activity and access:servers" }}
{{- end }}
{{- if and .Values.ingress.enabled (not .Values.ingress.host) }}
{{- fail "ingress.host is required with ingress.enabled: the host name of the web pages and the API" }}
{{- end }}
{{- range $k, $v := .Values.broker.settings }}
{{- if has $k (list "listen" "metrics-listen" "public-url" "redis-url" "redis-sentinel-master" "redis-sentinel-addrs" "redis-password-file" "redis-prefix" "kubeconfig" "namespace" "oidc-issuer" "oidc-audience" "oidc-client-id" "oidc-client-secret-file" "oidc-username-claim" "oidc-groups-claim" "admin-group" "hub-token-file" "hub-url" "hub-api-token-file" "profiles-file" "placement-policy" "host-root" "gpu-exposure" "runtime-class" "leader-election-namespace" "log-level" "log-format" "check-config" "connect" "notebook-mode" "notebook-domain") }}
{{- fail (printf "broker.settings.%s: the chart sets --%s from its own values (see the values table); set that value instead" $k $k) }}
{{- end }}
{{- end }}
{{- range $k, $v := .Values.agent.settings }}
{{- if has $k (list "node" "namespace" "redis-url" "redis-sentinel-master" "redis-sentinel-addrs" "redis-password-file" "redis-prefix" "host-root" "proc-root" "kubeconfig" "enforce" "metrics-addr" "log-level" "check-config" "connect") }}
{{- fail (printf "agent.settings.%s: the chart sets --%s from its own values (see the values table); set that value instead" $k $k) }}
{{- end }}
{{- end }}
{{- end }}

{{/* Redis environment for a binary whose variables start with $prefix. */}}
{{- define "gpubroker.redisEnv" -}}
{{- $ := .root }}
{{- $p := .prefix }}
{{- if or $.Values.redis.url $.Values.redis.inChart.enabled }}
- name: {{ $p }}REDIS_URL
  value: {{ include "gpubroker.redisURL" $ | quote }}
{{- else }}
- name: {{ $p }}REDIS_SENTINEL_MASTER
  value: {{ $.Values.redis.sentinel.master | quote }}
- name: {{ $p }}REDIS_SENTINEL_ADDRS
  value: {{ join "," $.Values.redis.sentinel.addrs | quote }}
{{- end }}
{{- if $.Values.redis.password.name }}
- name: {{ $p }}REDIS_PASSWORD_FILE
  value: {{ printf "%s/redis/%s" (include "gpubroker.secretsDir" $) $.Values.redis.password.key | quote }}
{{- end }}
- name: {{ $p }}REDIS_PREFIX
  value: {{ $.Values.redis.prefix | quote }}
{{- end }}

{{/* The settings map as environment: flag name → $prefix + NAME. */}}
{{- define "gpubroker.settingsEnv" -}}
{{- $p := .prefix }}
{{- range $k, $v := .settings }}
- name: {{ printf "%s%s" $p ($k | upper | replace "-" "_") }}
  value: {{ toString $v | quote }}
{{- end }}
{{- end }}
