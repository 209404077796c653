{{/*
Names, labels and the pieces every pod shares. Connector names may hold "_" and capitals
(local_ticket_system); resource names use a DNS-safe form, labels keep the real name.
*/}}

{{- define "agent-reach.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "agent-reach.fullname" -}}
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

{{- define "agent-reach.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "agent-reach.labels" -}}
helm.sh/chart: {{ include "agent-reach.chart" . }}
{{ include "agent-reach.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: agent-reach
{{- end }}

{{- define "agent-reach.selectorLabels" -}}
app.kubernetes.io/name: {{ include "agent-reach.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Selector labels of one component: (dict "root" $ "component" "router" ["connector" NAME]). */}}
{{- define "agent-reach.componentSelectorLabels" -}}
{{ include "agent-reach.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- with .connector }}
agent-reach/connector: {{ . }}
{{- end }}
{{- end }}

{{/* Every label of one component (same argument). */}}
{{- define "agent-reach.componentLabels" -}}
{{ include "agent-reach.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- with .connector }}
agent-reach/connector: {{ . }}
{{- end }}
{{- end }}

{{/* DNS-safe resource name of a connector's objects: <fullname>-<connector>. */}}
{{- define "agent-reach.connectorFullname" -}}
{{- printf "%s-%s" (include "agent-reach.fullname" .root) (.name | lower | replace "_" "-") | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "agent-reach.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "agent-reach.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "agent-reach.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Secret the chart creates when broker.url or redis.url is used. */}}
{{- define "agent-reach.secretName" -}}
{{- printf "%s-connections" (include "agent-reach.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "agent-reach.brokerSecretName" -}}
{{- if .Values.broker.existingSecret }}{{ .Values.broker.existingSecret }}{{ else }}{{ include "agent-reach.secretName" . }}{{ end }}
{{- end }}

{{- define "agent-reach.redisSecretName" -}}
{{- if .Values.redis.existingSecret }}{{ .Values.redis.existingSecret }}{{ else }}{{ include "agent-reach.secretName" . }}{{ end }}
{{- end }}

{{/* True (non-empty) when the chart renders its own Secret. */}}
{{- define "agent-reach.ownSecret" -}}
{{- if or (not .Values.broker.existingSecret) (not .Values.redis.existingSecret) }}true{{ end }}
{{- end }}

{{- define "agent-reach.catalogConfigMapName" -}}
{{- if .Values.catalog.existingConfigMap }}{{ .Values.catalog.existingConfigMap }}{{ else }}{{ printf "%s-catalog" (include "agent-reach.fullname" .) | trunc 63 | trimSuffix "-" }}{{ end }}
{{- end }}

{{/*
Checks that cannot be written in values.schema.json; every template includes this, so a bad
release fails before anything is rendered.
*/}}
{{- define "agent-reach.validate" -}}
{{- if and (not .Values.broker.existingSecret) (not .Values.broker.url) }}
{{- fail "broker: set broker.existingSecret (recommended) or broker.url" }}
{{- end }}
{{- include "agent-reach.validateBrokerCluster" . }}
{{- include "agent-reach.validateFiles" . }}
{{- if and (not .Values.redis.existingSecret) (not .Values.redis.url) }}
{{- fail "redis: set redis.existingSecret (recommended) or redis.url" }}
{{- end }}
{{- if and (not .Values.catalog.existingConfigMap) (not (trim .Values.catalog.inline)) }}
{{- fail "catalog: set catalog.inline (the catalog YAML) or catalog.existingConfigMap" }}
{{- end }}
{{- $seen := dict }}
{{- range $i, $c := .Values.connectors }}
{{- if or (eq $c.name "reach") (contains "__" $c.name) }}
{{- fail (printf "connectors[%d]: %q is not a usable connector name (\"reach\" is reserved and \"__\" separates connector and action in tool names)" $i $c.name) }}
{{- end }}
{{- $resource := include "agent-reach.connectorFullname" (dict "root" $ "name" $c.name) }}
{{- if hasKey $seen $resource }}
{{- fail (printf "connectors[%d]: %q and %q would both be named %s; connector names must differ after lower-casing and replacing _ with -" $i (get $seen $resource) $c.name $resource) }}
{{- end }}
{{- $_ := set $seen $resource $c.name }}
{{- range $component := list "router" "beat" "workflows" "mcp" "console" }}
{{- if eq $resource (printf "%s-%s" (include "agent-reach.fullname" $) $component) }}
{{- fail (printf "connectors[%d]: %q would be named %s, the name of the %s Deployment; put it in a poolGroups entry or rename the connector" $i $c.name $resource $component) }}
{{- end }}
{{- end }}
{{- $cfg := include "agent-reach.connectorConfig" (dict "root" $ "connector" $c) | fromYaml }}
{{- $as := $cfg.autoscaling }}
{{- if and $as.enabled (gt (int $as.minReplicas) (int $as.maxReplicas)) }}
{{- fail (printf "connectors[%d] (%s): autoscaling.minReplicas %d is greater than maxReplicas %d" $i $c.name (int $as.minReplicas) (int $as.maxReplicas)) }}
{{- end }}
{{- if hasKey $c "terminationGracePeriodSeconds" }}
{{- $floor := mul (int $cfg.maxActionTimeoutSeconds) (int $cfg.maxAttempts) }}
{{- if lt (int $c.terminationGracePeriodSeconds) (int $floor) }}
{{- fail (printf "connectors[%d] (%s): terminationGracePeriodSeconds %d is shorter than maxActionTimeoutSeconds x maxAttempts = %d; a pod could be killed in the middle of an action" $i $c.name (int $c.terminationGracePeriodSeconds) (int $floor)) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* broker.url may name several nodes (split by ";") for the fleet; KEDA's rabbitmq trigger takes one URL. */}}
{{- define "agent-reach.validateBrokerCluster" -}}
{{- if and (contains ";" .Values.broker.url) (not .Values.broker.existingSecret) (not .Values.keda.hostSecret.name) }}
{{- range $c := concat .Values.connectors (.Values.poolGroups | default list) }}
{{- $cfg := include "agent-reach.connectorConfig" (dict "root" $ "connector" $c) | fromYaml }}
{{- if $cfg.autoscaling.enabled }}
{{- fail (printf "keda: broker.url names several RabbitMQ nodes (split by \";\") but KEDA's rabbitmq trigger, which autoscales %s, takes one URL: set keda.hostSecret to a Secret holding one node's (or a load balancer's) URL" $c.name) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The effective settings of one connector, as YAML: connectorDefaults overlaid with the entry's
own keys. Argument: (dict "root" $ "connector" ENTRY). Keys are checked with hasKey, never
with `default` or `merge`, so an explicit false or 0 in an entry wins over a default.
*/}}
{{- define "agent-reach.connectorConfig" -}}
{{- $c := .connector }}
{{- $d := .root.Values.connectorDefaults }}
{{- $out := dict "name" $c.name }}
{{- range $key := list "replicas" "maxActionTimeoutSeconds" "maxAttempts" "gracePeriodMarginSeconds" "resources" "tolerations" "affinity" }}
{{- $_ := set $out $key (ternary (index $c $key) (index $d $key) (hasKey $c $key)) }}
{{- end }}
{{- $ownNames := list }}
{{- range $e := $c.env | default list }}{{ $ownNames = append $ownNames $e.name }}{{ end }}
{{- $env := list }}
{{- range $e := $d.env | default list }}
{{- if not (has $e.name $ownNames) }}{{ $env = append $env $e }}{{ end }}
{{- end }}
{{- /* adapter files (certificates, WSDL documents): the defaults' and the entry's own, the entry's winning by name */}}
{{- $files := list }}
{{- $ownFiles := list }}
{{- range $f := $c.files | default list }}{{ $ownFiles = append $ownFiles $f.name }}{{ end }}
{{- range $f := $d.files | default list }}
{{- if not (has $f.name $ownFiles) }}{{ $files = append $files $f }}{{ end }}
{{- end }}
{{- $files = concat $files ($c.files | default list) }}
{{- $fileEnv := list }}
{{- range $f := $files }}
{{- $path := include "agent-reach.fileMountPath" $f }}
{{- range $var := keys ($f.env | default dict) | sortAlpha }}
{{- if has $var $ownNames }}
{{- fail (printf "%s: %s is set both in env and by files[%s].env; keep one" $c.name $var $f.name) }}
{{- end }}
{{- $fileEnv = append $fileEnv (dict "name" $var "value" (printf "%s/%s" $path (index $f.env $var))) }}
{{- end }}
{{- end }}
{{- $_ := set $out "files" $files }}
{{- $_ := set $out "env" (concat $env ($c.env | default list) $fileEnv) }}
{{- $_ := set $out "envFrom" (concat ($d.envFrom | default list) ($c.envFrom | default list)) }}
{{- range $key := list "nodeSelector" "podAnnotations" "podLabels" }}
{{- $_ := set $out $key (mustMergeOverwrite (dict) (deepCopy (index $d $key | default dict)) (deepCopy (index $c $key | default dict))) }}
{{- end }}
{{- $as := dict }}
{{- $own := $c.autoscaling | default dict }}
{{- range $key, $value := $d.autoscaling }}
{{- $_ := set $as $key (ternary (index $own $key) $value (hasKey $own $key)) }}
{{- end }}
{{- $_ := set $out "autoscaling" $as }}
{{- if hasKey $c "concurrency" }}
{{- $_ := set $out "concurrency" $c.concurrency }}
{{- end }}
{{- $grace := add (mul (int $out.maxActionTimeoutSeconds) (int $out.maxAttempts)) (int $out.gracePeriodMarginSeconds) }}
{{- if hasKey $c "terminationGracePeriodSeconds" }}
{{- $grace = $c.terminationGracePeriodSeconds }}
{{- end }}
{{- $_ := set $out "terminationGracePeriodSeconds" (int $grace) }}
{{- toYaml $out }}
{{- end }}

{{/*
The connectors' own environment, for beat: it health-checks every connector, so it needs the
variables their catalog entries read (${VAR} in endpoints, key_env/token_env secrets). Returns
YAML {env: [...], envFrom: [...]}, each variable once and none that beat.env sets itself; two
pools that set one variable differently fail the release unless beat.env settles it.
*/}}
{{- define "agent-reach.connectorsEnv" -}}
{{- $env := list }}
{{- $byName := dict }}
{{- range $e := .Values.beat.env | default list }}{{ $_ := set $byName $e.name $e }}{{ end }}
{{- $beatOwn := keys $byName }}
{{- $envFrom := list }}
{{- /* pool groups' env too: their connectors are health-checked like any other */}}
{{- range $c := concat .Values.connectors (.Values.poolGroups | default list) }}
{{- $cfg := include "agent-reach.connectorConfig" (dict "root" $ "connector" $c) | fromYaml }}
{{- range $e := $cfg.env | default list }}
{{- if has $e.name $beatOwn }}
{{- /* beat.env decides */}}
{{- else if hasKey $byName $e.name }}
{{- if ne (toJson (get $byName $e.name)) (toJson $e) }}
{{- fail (printf "connectors: %s is set differently by two pools (the second is %s); beat health-checks every connector with one environment: set %s in beat.env to choose its value there, or give the pools different variable names" $e.name $c.name $e.name) }}
{{- end }}
{{- else }}
{{- $_ := set $byName $e.name $e }}
{{- $env = append $env $e }}
{{- end }}
{{- end }}
{{- range $source := $cfg.envFrom | default list }}
{{- if not (has $source $envFrom) }}
{{- $envFrom = append $envFrom $source }}
{{- end }}
{{- end }}
{{- end }}
{{- toYaml (dict "env" $env "envFrom" $envFrom) }}
{{- end }}

{{/* Environment every process gets. */}}
{{- define "agent-reach.commonEnv" -}}
- name: REACH_BROKER_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "agent-reach.brokerSecretName" . }}
      key: {{ .Values.broker.existingSecretKey }}
- name: REACH_QUEUE_TYPE
  value: {{ .Values.broker.queueType | quote }}
- name: REACH_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "agent-reach.redisSecretName" . }}
      key: {{ .Values.redis.existingSecretKey }}
- name: REACH_REDIS_WAIT_REPLICAS
  value: {{ .Values.redis.waitReplicas | default 0 | quote }}
- name: REACH_REDIS_WAIT_TIMEOUT_MS
  value: {{ .Values.redis.waitTimeoutMs | default 100 | quote }}
{{- /* The kubelet writes a ConfigMap volume as <mountPath>/..<timestamp>/FILE plus symlinks
       <mountPath>/..data -> ..<timestamp> and <mountPath>/FILE -> ..data/FILE. The catalog loader
       reads every *.yaml below REACH_CATALOG, so pointing it at the mount would read each file
       twice; ..data holds exactly one copy of each. */}}
- name: REACH_CATALOG
  value: {{ printf "%s/..data" .Values.catalog.mountPath | quote }}
- name: REACH_METRICS_PORT
  value: {{ .Values.metrics.port | quote }}
- name: REACH_LOG_LEVEL
  value: {{ .Values.config.logLevel | quote }}
- name: REACH_REQUIRE_USER_ID
  value: {{ ternary "1" "0" .Values.config.requireUserId | quote }}
- name: REACH_RECEIPT_TTL
  value: {{ .Values.config.receiptTTL | quote }}
- name: REACH_MAX_INTENT_BYTES
  value: {{ .Values.config.maxIntentBytes | quote }}
- name: REACH_HISTORY_TTL
  value: {{ .Values.config.historyTTL | quote }}
{{- /* the runner writes runs with it, and so do `reach workflow resume|abort` and the console */}}
- name: REACH_WORKFLOW_RETENTION
  value: {{ .Values.workflows.retention | quote }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Pod-template annotations every component gets: checksums and scrape hints. */}}
{{- define "agent-reach.podAnnotations" -}}
checksum/catalog: {{ include "agent-reach.catalogChecksum" . }}
{{- if include "agent-reach.ownSecret" . }}
checksum/secret: {{ include "agent-reach.secretData" . | sha256sum }}
{{- end }}
{{- if .Values.metrics.podAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .Values.metrics.port | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end }}

{{/*
Changes whenever the inline catalog does, so every pod rolls onto the new catalog. An
existingConfigMap's content is out of the chart's sight: only its name counts.
*/}}
{{- define "agent-reach.catalogChecksum" -}}
{{- if .Values.catalog.existingConfigMap }}
{{- printf "configmap:%s" .Values.catalog.existingConfigMap | sha256sum }}
{{- else }}
{{- .Values.catalog.inline | sha256sum }}
{{- end }}
{{- end }}

{{/* The data of the chart's own Secret (only the URLs not taken from an existingSecret). */}}
{{- define "agent-reach.secretData" -}}
{{- if not .Values.broker.existingSecret }}
{{ .Values.broker.existingSecretKey }}: {{ .Values.broker.url | b64enc | quote }}
{{- end }}
{{- if not .Values.redis.existingSecret }}
{{ .Values.redis.existingSecretKey }}: {{ .Values.redis.url | b64enc | quote }}
{{- end }}
{{- end }}

{{/* Ports, probes, mounts and security shared by every container. */}}
{{- define "agent-reach.containerCommon" -}}
{{- /* `volumeMounts` stays last: containerCommonWithFiles appends to it */}}
ports:
  - name: metrics
    containerPort: {{ .Values.metrics.port }}
    protocol: TCP
startupProbe:
  httpGet:
    path: /healthz
    port: metrics
  periodSeconds: {{ .Values.probes.startup.periodSeconds }}
  timeoutSeconds: {{ .Values.probes.startup.timeoutSeconds }}
  failureThreshold: {{ .Values.probes.startup.failureThreshold }}
livenessProbe:
  httpGet:
    path: /healthz
    port: metrics
  periodSeconds: {{ .Values.probes.liveness.periodSeconds }}
  timeoutSeconds: {{ .Values.probes.liveness.timeoutSeconds }}
  failureThreshold: {{ .Values.probes.liveness.failureThreshold }}
readinessProbe:
  httpGet:
    path: /readyz
    port: metrics
  periodSeconds: {{ .Values.probes.readiness.periodSeconds }}
  timeoutSeconds: {{ .Values.probes.readiness.timeoutSeconds }}
  failureThreshold: {{ .Values.probes.readiness.failureThreshold }}
securityContext:
  {{- toYaml .Values.securityContext | nindent 2 }}
volumeMounts:
  - name: catalog
    mountPath: {{ .Values.catalog.mountPath }}
    readOnly: true
  - name: tmp
    mountPath: /tmp
{{- with .Values.extraVolumeMounts }}
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Where an adapter file entry is mounted: its mountPath, or /etc/agent-reach/files/<name>. */}}
{{- define "agent-reach.fileMountPath" -}}
{{- .mountPath | default (printf "/etc/agent-reach/files/%s" .name) | trimSuffix "/" }}
{{- end }}

{{/*
The volumes of adapter files (`files:` of a connector, a group or connectorDefaults): a Secret or
a ConfigMap each, read-only, readable by the image's group only (client keys are secrets).
Argument: the list of file entries.
*/}}
{{- define "agent-reach.fileVolumes" -}}
{{- range $f := . }}
- name: file-{{ $f.name }}
  {{- if $f.secret }}
  secret:
    secretName: {{ $f.secret }}
    defaultMode: 0440
  {{- else }}
  configMap:
    name: {{ $f.configMap }}
    defaultMode: 0444
  {{- end }}
{{- end }}
{{- end }}

{{/* The mounts of adapter files (same argument). */}}
{{- define "agent-reach.fileVolumeMounts" -}}
{{- range $f := . }}
- name: file-{{ $f.name }}
  mountPath: {{ include "agent-reach.fileMountPath" $f }}
  readOnly: true
{{- end }}
{{- end }}

{{/* Adapter files' mount paths: distinct within a pod (beat's holds them all) and clear of the catalog and /tmp. */}}
{{- define "agent-reach.validateFiles" -}}
{{- $reserved := list (trimSuffix "/" .Values.catalog.mountPath) "/tmp" }}
{{- $all := dict }}
{{- range $c := concat .Values.connectors (.Values.poolGroups | default list) }}
{{- $cfg := include "agent-reach.connectorConfig" (dict "root" $ "connector" $c) | fromYaml }}
{{- $paths := dict }}
{{- range $f := $cfg.files | default list }}
{{- $path := include "agent-reach.fileMountPath" $f }}
{{- if has $path $reserved }}
{{- fail (printf "%s: files[%s].mountPath %s is where the chart mounts the catalog or /tmp; pick another directory" $c.name $f.name $path) }}
{{- end }}
{{- if hasKey $paths $path }}
{{- fail (printf "%s: files[%s] and files[%s] are both mounted at %s" $c.name (get $paths $path) $f.name $path) }}
{{- end }}
{{- $_ := set $paths $path $f.name }}
{{- if and (hasKey $all $path) (ne (get $all $path) $f.name) }}
{{- fail (printf "%s: files[%s] is mounted at %s, where another pool mounts files[%s]; beat mounts both in one pod: use different paths" $c.name $f.name $path (get $all $path)) }}
{{- end }}
{{- $_ := set $all $path $f.name }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Every connector's and group's adapter files, once each by name, for beat (it health-checks every
connector through its adapter, so it needs their certificates too). Two entries with one name
and different contents fail the release. Returns YAML {files: [...]}.
*/}}
{{- define "agent-reach.allFiles" -}}
{{- $byName := dict }}
{{- $files := list }}
{{- range $c := concat .Values.connectors (.Values.poolGroups | default list) }}
{{- $cfg := include "agent-reach.connectorConfig" (dict "root" $ "connector" $c) | fromYaml }}
{{- range $f := $cfg.files | default list }}
{{- if hasKey $byName $f.name }}
{{- if ne (toJson (get $byName $f.name)) (toJson $f) }}
{{- fail (printf "files: %q is declared differently by two pools (the second is %s); beat mounts every pool's files in one pod: give them different names" $f.name $c.name) }}
{{- end }}
{{- else }}
{{- $_ := set $byName $f.name $f }}
{{- $files = append $files $f }}
{{- end }}
{{- end }}
{{- end }}
{{- toYaml (dict "files" $files) }}
{{- end }}

{{/*
The variables adapter files set (paths, never contents), for processes that load the catalog
without calling systems (router, mcp, console): `wsdl: ${VAR}` must expand there too.
*/}}
{{- define "agent-reach.fileEnv" -}}
{{- /* each variable once; which pool's path it gets does not matter here, nothing opens it */}}
{{- $seen := dict }}
{{- range $c := concat .Values.connectors (.Values.poolGroups | default list) }}
{{- $cfg := include "agent-reach.connectorConfig" (dict "root" $ "connector" $c) | fromYaml }}
{{- range $f := $cfg.files | default list }}
{{- $path := include "agent-reach.fileMountPath" $f }}
{{- range $var := keys ($f.env | default dict) | sortAlpha }}
{{- if not (hasKey $seen $var) }}
{{- $_ := set $seen $var true }}
- name: {{ $var }}
  value: {{ printf "%s/%s" $path (index $f.env $var) | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* Pod-spec fields shared by every pod. `volumes` stays last: podCommonWithFiles appends to it. */}}
{{- define "agent-reach.podCommon" -}}
serviceAccountName: {{ include "agent-reach.serviceAccountName" . }}
automountServiceAccountToken: false
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
volumes:
  - name: catalog
    configMap:
      name: {{ include "agent-reach.catalogConfigMapName" . }}
  - name: tmp
    emptyDir: {}
{{- with .Values.extraVolumes }}
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* podCommon plus the volumes of adapter files: (dict "root" $ "files" LIST). */}}
{{- define "agent-reach.podCommonWithFiles" -}}
{{ include "agent-reach.podCommon" .root }}
{{- with .files }}
{{ include "agent-reach.fileVolumes" . | indent 2 }}
{{- end }}
{{- end }}

{{/* containerCommon plus the mounts of adapter files (same argument). */}}
{{- define "agent-reach.containerCommonWithFiles" -}}
{{ include "agent-reach.containerCommon" .root }}
{{- with .files }}
{{ include "agent-reach.fileVolumeMounts" . | indent 2 }}
{{- end }}
{{- end }}
