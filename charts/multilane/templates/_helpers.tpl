{{/* Chart name, truncated to the 63 characters of a label value. */}}
{{- define "multilane.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: release-chart unless the release name already contains the chart name. */}}
{{- define "multilane.fullname" -}}
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

{{- define "multilane.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object of the release. */}}
{{- define "multilane.labels" -}}
helm.sh/chart: {{ include "multilane.chart" . }}
app.kubernetes.io/name: {{ include "multilane.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: multilane
{{- end }}

{{/* Selector labels of the operator pods (also used by the worker NetworkPolicy). */}}
{{- define "multilane.operatorSelectorLabels" -}}
app.kubernetes.io/name: {{ include "multilane.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "multilane.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "multilane.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "multilane.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/* Namespaces that get the worker NetworkPolicy. */}}
{{- define "multilane.networkPolicyNamespaces" -}}
{{- if .Values.networkPolicy.namespaces }}
{{- toYaml .Values.networkPolicy.namespaces }}
{{- else if .Values.operator.watchNamespaces }}
{{- toYaml .Values.operator.watchNamespaces }}
{{- else }}
{{- toYaml (list .Release.Namespace) }}
{{- end }}
{{- end }}

{{/*
Rules the operator needs on namespaced resources, wherever it watches ParallelConsumers.
Every rule names its resources and verbs; there is no wildcard, no bind/escalate/impersonate.
*/}}
{{- define "multilane.operatorNamespacedRules" -}}
# The watched resource: kopf lists/watches it and patches finalizers, annotations and status.
- apiGroups: [multilane.dev]
  resources: [parallelconsumers]
  verbs: [get, list, watch, patch]
- apiGroups: [multilane.dev]
  resources: [parallelconsumers/status]
  verbs: [get, patch]
# kopf reports handler progress and errors as Events of the ParallelConsumer; the operator lists
# Events only while a StatefulSet has fewer pods than replicas (a FailedCreate says why: Degraded).
- apiGroups: [""]
  resources: [events]
  verbs: [list, create, patch]
# Children of every ParallelConsumer, created (or merge-patched when they exist) with owner
# references; the garbage collector deletes them with their owner, so no delete verb.
- apiGroups: [apps]
  resources: [statefulsets]
  verbs: [get, list, watch, create, patch]
- apiGroups: [""]
  resources: [services, serviceaccounts]
  verbs: [get, create, patch]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, create, patch]
# CronJob NAME-snapshot (scheduled state snapshots). Removing the schedule suspends it (patch), so
# no delete here either.
- apiGroups: [batch]
  resources: [cronjobs]
  verbs: [get, create, patch]
# Secrets: the operator creates NAME-control-token once and reads it back (bearer token of the
# workers' control port); it reads spec.kafka.credentialsSecretRef to reach the Kafka admin API.
# No list/watch: it can only read Secrets whose names it is given.
- apiGroups: [""]
  resources: [secrets]
  verbs: {{ toJson .Values.rbac.secretVerbs }}
# Worker pods: observed for readiness and partition handoff; deleted during rollouts.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, delete]
# Worker leases NAME-<ordinal>: the operator creates them and reads the workers' renewals. It holds
# get/update itself, which is what lets it grant them (RBAC escalation check) without bind/escalate.
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [get, list, watch, create, update, patch, delete]
# Role + RoleBinding NAME-worker (see worker.rules in values.yaml): namespaced, and only with
# permissions the operator holds itself.
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [get, create, patch]
{{- end }}
