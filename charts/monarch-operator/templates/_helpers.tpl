{{/*
Names, labels and the operator's RBAC rules, shared by every template.
*/}}

{{/* The chart's name, overridable with nameOverride. */}}
{{- define "monarch-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name of the release's objects: fullnameOverride, else the release name (plus the
chart's name when the release name does not contain it). 63 characters at most (DNS label). */}}
{{- define "monarch-operator.fullname" -}}
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

{{- define "monarch-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "monarch-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "monarch-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "monarch-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "monarch-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "monarch-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "monarch-operator.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
What the operator does in the namespaces it watches, and nothing more (tests/unit/test_chart_rbac.py
compares these rules with the API calls in operator/monarch_operator/controller/ and kopf's):
- monarchjobs: kopf lists and watches them (events wake a job's pass) and removes its finalizer
  left by older operator versions (patch); a pass reads its job (get); status: one merge-patch
  when it changed.
- secrets, services, configmaps, networkpolicies, and the watched kinds below: kopf lists and
  watches the job's children (label selector) into the operator's cache, which its passes read.
- secrets, services: read, create when missing (never updated); deleted by cleanupPolicy
  DeleteAll, and with the job: the owner reference lets the garbage collector delete them, and
  the operator deletes a deleted job's children at once (the collector may not know the
  MonarchJob kind yet, and a pass racing the deletion may just have created one).
- configmaps (the hostfile), pods (the launcher of each attempt), statefulsets (the workers):
  read, create, delete (a suspended job drops them; a finished one its workers).
- pods, statefulsets: kopf watches the job's children (label selector) to wake the job; pods
  are listed for readiness and the launcher's exit code; worker pods on a lost node are deleted.
- pods/log: the last lines of a failed launcher (status.attempts[].outputTail).
- events: the job's Events (kopf), created; FailedCreate Events of worker StatefulSets are
  listed and watched (a pod the StatefulSet cannot create wakes the job and is named).
- monarchjobs delete: spec.ttlSecondsAfterFinished deletes a finished job.
- monarchjobs/finalizers update: every child's owner reference has blockOwnerDeletion: true,
  which the OwnerReferencesPermissionEnforcement admission plugin (on by default in OpenShift)
  allows only to a user that may update the owner's finalizers (field case C24). No finalizer
  is ever written: this is the permission the plugin checks.
- networkpolicies: read, create the job's NetworkPolicy (networkPolicy.enabled); delete it
  when the job is deleted, as its other children.
*/}}
{{- define "monarch-operator.namespacedRules" -}}
- apiGroups: [monarch-operator.dev]
  resources: [monarchjobs]
  verbs: [get, list, watch, patch, delete]
- apiGroups: [monarch-operator.dev]
  resources: [monarchjobs/status]
  verbs: [patch]
- apiGroups: [monarch-operator.dev]
  resources: [monarchjobs/finalizers]
  verbs: [update]
- apiGroups: [""]
  resources: [secrets, services]
  verbs: [get, list, watch, create, delete]
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, watch, create, delete, patch]
{{- /* Per job: the launcher's ServiceAccount and a Role (and its binding) that may get and
patch the job's own progress ConfigMap, nothing else; granting that needs get and patch on
configmaps above (RBAC's escalation check). */}}
- apiGroups: [""]
  resources: [serviceaccounts]
  verbs: [get, create, delete]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [get, create, delete]
{{- /* patch: attach mode's rank labels on worker pods (controller/spec/attachmode.py). */}}
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, create, delete, patch]
- apiGroups: [""]
  resources: [pods/log]
  verbs: [get]
- apiGroups: [apps]
  resources: [statefulsets]
  verbs: [get, list, watch, create, delete]
- apiGroups: [""]
  resources: [events]
  verbs: [list, watch, create]
{{- if .Values.networkPolicy.enabled }}
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, list, watch, create, delete]
{{- end }}
{{- if .Values.kueue.enabled }}
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads]
  verbs: [get, list, watch, create, update, patch, delete]
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads/status]
  verbs: [update]
- apiGroups: [kueue.x-k8s.io]
  resources: [localqueues]
  verbs: [get]
{{- end }}
{{- end }}

{{/* Cluster-wide only: kopf watches CustomResourceDefinitions to notice the MonarchJob CRD
being added or removed while it runs, a pass reads the node of a worker that stopped being
Ready (a lost node is an infrastructure failure), and a failed launcher's verdict waits for the
node heartbeats (Leases in kube-node-lease) of its workers and lists the nodes to see whether
one was NotReady since the launcher's end. Namespaced mode needs no such rule:
kopf's scan is off (--namespace), and a 403 on nodes or Leases leaves the pod's own state to
tell. */}}
{{- define "monarch-operator.clusterOnlyRules" -}}
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
- apiGroups: [""]
  resources: [nodes]
  verbs: [get, list]
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [list]
{{- if .Values.kueue.enabled }}
- apiGroups: [kueue.x-k8s.io]
  resources: [resourceflavors, workloadpriorityclasses]
  verbs: [get]
{{- end }}
{{- end }}

{{/* Refuse an upgrade that turns leader election on while a pod of this release runs the
operator alone (no --leader-elect: a release installed with leaderElection.enabled=false).
The rolling update would start a leader beside it, and it holds no Lease to step back from:
two operators would act on every job until the old pod ended. `lookup` reads the cluster only
in `helm install/upgrade` (and --dry-run=server); `helm template` and tools built on it (Argo
CD) see nothing and cannot refuse (docs/ha.md). Ended pods (Succeeded, Failed) run nothing. */}}
{{- define "monarch-operator.refuseBesideLoneReplicas" -}}
{{- if .Values.leaderElection.enabled }}
{{- $selector := include "monarch-operator.selectorLabels" . | fromYaml }}
{{- $lone := list }}
{{- range (lookup "v1" "Pod" .Release.Namespace "").items | default list }}
{{- $pod := . }}
{{- $labels := $pod.metadata.labels | default dict }}
{{- $ours := true }}
{{- range $key, $value := $selector }}
{{- if ne (get $labels $key | toString) (toString $value) }}{{ $ours = false }}{{ end }}
{{- end }}
{{- $phase := ($pod.status | default dict).phase | default "" }}
{{- if and $ours (not (has $phase (list "Succeeded" "Failed"))) }}
{{- range $pod.spec.containers }}
{{- if and (eq .name "operator") (not (has "--leader-elect" (.args | default list))) }}
{{- $lone = append $lone $pod.metadata.name }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- if $lone }}
{{- $fullname := include "monarch-operator.fullname" . }}
{{- fail (printf "upgrade refused: pod %s runs the operator alone (leader election off); this upgrade would start a leader beside it and both would act on every job. Stop it first, wait until its pods are gone, then run this upgrade again:\n  kubectl scale deployment/%s -n %s --replicas=0\n  kubectl wait --for=delete pod -n %s -l app.kubernetes.io/name=%s,app.kubernetes.io/instance=%s --timeout=120s\n(running jobs go on meanwhile; none is reconciled until the new leader starts: docs/ha.md)" (join ", " $lone) $fullname .Release.Namespace .Release.Namespace (include "monarch-operator.name" .) .Release.Name) }}
{{- end }}
{{- end }}
{{- end }}
