{{/*
Pool groups (`poolGroups`): several connectors in one Deployment running
`reach worker A B C --group NAME`; each connector keeps its own threads, prefetch, breaker and
pause flag inside the process (docs/operations.md "Pool groups").
*/}}

{{/* DNS-safe resource name of a pool group's objects: <fullname>-group-<name>. */}}
{{- define "agent-reach.groupFullname" -}}
{{- printf "%s-group-%s" (include "agent-reach.fullname" .root) (.name | lower | replace "_" "-") | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels of a group's pods: (dict "root" $ "name" GROUP). */}}
{{- define "agent-reach.groupSelectorLabels" -}}
{{ include "agent-reach.selectorLabels" .root }}
app.kubernetes.io/component: worker
agent-reach/pool-group: {{ .name }}
{{- end }}

{{/* Every label of a group's objects (same argument). */}}
{{- define "agent-reach.groupLabels" -}}
{{ include "agent-reach.labels" .root }}
app.kubernetes.io/component: worker
agent-reach/pool-group: {{ .name }}
{{- end }}

{{/* A member's connector name: a member is a name, or {name, concurrency}. */}}
{{- define "agent-reach.memberName" -}}
{{- if kindIs "string" . }}{{ . }}{{ else }}{{ .name }}{{ end }}
{{- end }}

{{/* The connector names of a group, as a JSON list. */}}
{{- define "agent-reach.groupConnectors" -}}
{{- $names := list }}
{{- range $m := .connectors }}{{ $names = append $names (include "agent-reach.memberName" $m) }}{{ end }}
{{- toJson $names }}
{{- end }}

{{/* `reach worker`'s arguments for a group, as a JSON list: NAME or NAME:THREADS each, then --group NAME. */}}
{{- define "agent-reach.groupArgs" -}}
{{- $args := list "worker" }}
{{- range $m := .connectors }}
{{- if and (kindIs "map" $m) (hasKey $m "concurrency") }}
{{- $args = append $args (printf "%s:%d" $m.name (int $m.concurrency)) }}
{{- else }}
{{- $args = append $args (include "agent-reach.memberName" $m) }}
{{- end }}
{{- end }}
{{- toJson (concat $args (list "--group" .name)) }}
{{- end }}

{{/*
Checks of poolGroups the schema cannot make: a connector runs in one place only (its own pool or
one group), names that would collide, and the same limits as a connector's pool.
*/}}
{{- define "agent-reach.validateGroups" -}}
{{- $placed := dict }}
{{- range $c := .Values.connectors }}{{ $_ := set $placed $c.name "its own pool (connectors)" }}{{ end }}
{{- $seen := dict }}
{{- range $i, $g := .Values.poolGroups }}
{{- $resource := include "agent-reach.groupFullname" (dict "root" $ "name" $g.name) }}
{{- if hasKey $seen $resource }}
{{- fail (printf "poolGroups[%d]: %q and %q would both be named %s; group names must differ after lower-casing and replacing _ with -" $i (get $seen $resource) $g.name $resource) }}
{{- end }}
{{- $_ := set $seen $resource $g.name }}
{{- range $m := $g.connectors }}
{{- $name := include "agent-reach.memberName" $m }}
{{- if or (eq $name "reach") (contains "__" $name) }}
{{- fail (printf "poolGroups[%d] (%s): %q is not a usable connector name (\"reach\" is reserved and \"__\" separates connector and action in tool names)" $i $g.name $name) }}
{{- end }}
{{- if hasKey $placed $name }}
{{- fail (printf "poolGroups[%d] (%s): connector %q already runs in %s; a connector's queue is consumed by one Deployment" $i $g.name $name (get $placed $name)) }}
{{- end }}
{{- $_ := set $placed $name (printf "pool group %s" $g.name) }}
{{- end }}
{{- $cfg := include "agent-reach.connectorConfig" (dict "root" $ "connector" $g) | fromYaml }}
{{- $as := $cfg.autoscaling }}
{{- if and $as.enabled (gt (int $as.minReplicas) (int $as.maxReplicas)) }}
{{- fail (printf "poolGroups[%d] (%s): autoscaling.minReplicas %d is greater than maxReplicas %d" $i $g.name (int $as.minReplicas) (int $as.maxReplicas)) }}
{{- end }}
{{- if hasKey $g "terminationGracePeriodSeconds" }}
{{- $floor := mul (int $cfg.maxActionTimeoutSeconds) (int $cfg.maxAttempts) }}
{{- if lt (int $g.terminationGracePeriodSeconds) (int $floor) }}
{{- fail (printf "poolGroups[%d] (%s): terminationGracePeriodSeconds %d is shorter than maxActionTimeoutSeconds x maxAttempts = %d; a pod could be killed in the middle of an action" $i $g.name (int $g.terminationGracePeriodSeconds) (int $floor)) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
