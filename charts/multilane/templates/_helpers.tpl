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

{{/*
A name made of the full name and a suffix, cut so that the whole fits 63 characters (a Service name is
a DNS-1035 label; a label value is at most 63): include "multilane.suffixed" (list . "metrics").
*/}}
{{- define "multilane.suffixed" -}}
{{- $ctx := index . 0 }}
{{- $suffix := index . 1 }}
{{- $room := sub 62 (len $suffix) | int }}
{{- printf "%s-%s" (include "multilane.fullname" $ctx | trunc $room | trimSuffix "-") $suffix }}
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

{{/* A label map as K=V,K=V (sorted), for the operator's --*-labels flags. */}}
{{- define "multilane.labelList" -}}
{{- $pairs := list }}
{{- range $k, $v := . }}{{- $pairs = append $pairs (printf "%s=%s" $k $v) }}{{- end }}
{{- join "," $pairs }}
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

{{/* Namespaces where the operator may create and read back control Secrets (a Role in each). */}}
{{- define "multilane.secretNamespaces" -}}
{{- if .Values.rbac.secretNamespaces }}
{{- toYaml .Values.rbac.secretNamespaces }}
{{- else if .Values.operator.watchNamespaces }}
{{- toYaml .Values.operator.watchNamespaces }}
{{- else }}
{{- toYaml (list .Release.Namespace) }}
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
# Each rule names the code that needs it (docs/security.md); tests/operator/test_zz_least_privilege.py
# fails when a scenario needs none of a rule's verbs.
# The watched resource: kopf lists/watches it and patches finalizers and annotations; the handlers
# read it (get) and patch its status.
- apiGroups: [multilane.dev]
  resources: [parallelconsumers]
  verbs: [get, list, watch, patch]
- apiGroups: [multilane.dev]
  resources: [parallelconsumers/status]
  verbs: [patch]
# Children carry ownerReferences with blockOwnerDeletion: true, which needs update on the owner's
# finalizers subresource where the OwnerReferencesPermissionEnforcement admission plugin runs
# (OpenShift, hardened clusters); without it every child create is forbidden there.
- apiGroups: [multilane.dev]
  resources: [parallelconsumers/finalizers]
  verbs: [update]
# kopf and the handlers post Events of the ParallelConsumer; the operator lists Events only while a
# StatefulSet has fewer pods than replicas (a FailedCreate says why: Degraded).
- apiGroups: [""]
  resources: [events]
  verbs: [list, create]
# Children of every ParallelConsumer, created (or merge-patched when they exist) with owner
# references; the garbage collector deletes them with their owner, so no delete verb but for the
# StatefulSet's opt-in recreate and the pods' day-2 replacement (below).
# delete: only the opt-in recreate of a StatefulSet whose immutable fields a spec change would change
# (annotation multilane.dev/recreate-on-immutable-change; propagationPolicy Orphan keeps the pods).
# list/watch: the operator reads StatefulSets, pods and Leases from kopf indexes (watches), not by
# per-pass GETs (multilane/operator/k8s/cache.py).
- apiGroups: [apps]
  resources: [statefulsets]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [services, serviceaccounts]
  verbs: [create, patch]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [create, patch]
# CronJob NAME-snapshot (scheduled state snapshots). Removing the schedule suspends it (get, patch).
- apiGroups: [batch]
  resources: [cronjobs]
  verbs: [get, create, patch]
# Worker pods: watched (by the consumer label) for readiness and template revisions; delete: the day-2
# replacement of a pod that runs an outdated template, once its partitions moved to warm owners
# (multilane/operator/rollout/replacement.py, KubernetesPlatform.replace_worker).
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch, delete]
# Worker leases NAME-<ordinal>: the operator creates them and lists the workers' renewals. get/update:
# what the workers' Role grants (Kubernetes lets a subject grant only permissions it holds); also the
# operator replicas' leader Lease (get, create, update; also granted by NAME-leader-election).
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [get, list, watch, create, update]
{{- if .Values.networkPolicy.enabled }}
# NetworkPolicy NAME-workers (multilane/operator/spec/network.py): created, or patched when it exists.
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [create, patch]
{{- end }}
# Role + RoleBinding NAME-worker: created, or patched when they exist.
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [create, patch]
{{- end }}
