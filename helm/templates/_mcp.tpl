{{/*
The MCP facade (`reach mcp --http`): its checks and its environment. It needs no Redis and
publishes with a broker login of its own (the impersonator tag), so it does not take commonEnv.
*/}}

{{- define "agent-reach.mcpValidate" -}}
{{- $m := .Values.mcp }}
{{- if $m.enabled }}
{{- if not $m.url }}
{{- fail "mcp.url: set the URL MCP clients reach the facade at (REACH_MCP_URL), e.g. https://reach.example.com/mcp" }}
{{- end }}
{{- if not $m.broker.existingSecret }}
{{- fail "mcp.broker.existingSecret: the facade needs a broker login of its own with the impersonator tag (reach mcp-user create), in a Secret; never the fleet's login" }}
{{- end }}
{{- if and (not $m.tokens.existingSecret) (not $m.jwt.existingSecret) }}
{{- fail "mcp: set mcp.tokens.existingSecret (static tokens) and/or mcp.jwt.existingSecret (JWTs); the facade never serves without authentication" }}
{{- end }}
{{- if lt (int $m.terminationGracePeriodSeconds) (int $m.waitSeconds) }}
{{- fail (printf "mcp.terminationGracePeriodSeconds %d is shorter than mcp.waitSeconds %d; a pod could be stopped while calls wait for their receipts" (int $m.terminationGracePeriodSeconds) (int $m.waitSeconds)) }}
{{- end }}
{{- end }}
{{- end }}

{{- define "agent-reach.mcpTokensDir" -}}/etc/reach/mcp-tokens{{- end }}

{{- define "agent-reach.mcpEnv" -}}
{{- $m := .Values.mcp }}
- name: REACH_BROKER_URL
  valueFrom:
    secretKeyRef:
      name: {{ $m.broker.existingSecret }}
      key: {{ $m.broker.existingSecretKey }}
- name: REACH_CATALOG
  value: {{ printf "%s/..data" .Values.catalog.mountPath | quote }}
- name: REACH_METRICS_PORT
  value: {{ .Values.metrics.port | quote }}
- name: REACH_LOG_LEVEL
  value: {{ .Values.config.logLevel | quote }}
- name: REACH_MAX_INTENT_BYTES
  value: {{ .Values.config.maxIntentBytes | quote }}
{{- with include "agent-reach.fileEnv" . }}
{{ . }}
{{- end }}
- name: REACH_MCP_URL
  value: {{ $m.url | quote }}
- name: REACH_MCP_HOST
  value: "0.0.0.0"
- name: REACH_MCP_PORT
  value: {{ $m.port | quote }}
- name: REACH_MCP_WAIT
  value: {{ $m.waitSeconds | quote }}
- name: REACH_MCP_CLIENTS_PER_AGENT
  value: {{ $m.clientsPerAgent | quote }}
{{- if $m.tokens.existingSecret }}
- name: REACH_MCP_TOKENS_FILE
  value: {{ printf "%s/tokens.yaml" (include "agent-reach.mcpTokensDir" .) | quote }}
{{- end }}
{{- if $m.jwt.existingSecret }}
- name: REACH_MCP_JWT_KEY
  valueFrom:
    secretKeyRef:
      name: {{ $m.jwt.existingSecret }}
      key: {{ $m.jwt.existingSecretKey }}
- name: REACH_MCP_JWT_ALGORITHM
  value: {{ $m.jwt.algorithm | quote }}
{{- if $m.jwt.issuerUrl }}
- name: REACH_MCP_ISSUER_URL
  value: {{ $m.jwt.issuerUrl | quote }}
{{- end }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- with $m.env }}
{{ toYaml . }}
{{- end }}
{{- end }}
