{{/*
The operator console (`reach console`): its checks and its environment. It reads Redis and the
broker as the fleet does (commonEnv) and its users from a Secret of their own. It loads the
catalog too, so it gets the adapter files' variables (paths only, as the router and the MCP facade).
*/}}

{{- define "agent-reach.consoleValidate" -}}
{{- $c := .Values.console }}
{{- if $c.enabled }}
{{- if not $c.users.existingSecret }}
{{- fail "console.users.existingSecret: the console needs a users file (login name -> {password_hash, role}, hashes from `reach console hash-password`) in a Secret" }}
{{- end }}
{{- if and (gt (int $c.replicas) 1) (not $c.sessionKey.existingSecret) }}
{{- fail "console.sessionKey.existingSecret: with more than one console replica every pod must sign sessions with the same key; put one in a Secret" }}
{{- end }}
{{- if and $c.ingress.enabled (not $c.publicUrl) }}
{{- fail "console.publicUrl: behind an Ingress set the URL browsers use (e.g. https://reach-console.example.com); forms are accepted only from it" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "agent-reach.consoleUsersDir" -}}/etc/reach/console-users{{- end }}

{{- define "agent-reach.consoleEnv" -}}
{{- $c := .Values.console }}
{{ include "agent-reach.commonEnv" . }}
{{- with include "agent-reach.fileEnv" . }}
{{ . }}
{{- end }}
- name: REACH_CONSOLE_HOST
  value: "0.0.0.0"
- name: REACH_CONSOLE_PORT
  value: {{ $c.port | quote }}
- name: REACH_CONSOLE_USERS
  value: {{ printf "%s/users.yaml" (include "agent-reach.consoleUsersDir" .) | quote }}
- name: REACH_CONSOLE_SECURE_COOKIE
  value: {{ ternary "1" "0" $c.secureCookie | quote }}
- name: REACH_CONSOLE_SESSION_TTL
  value: {{ $c.sessionTTL | quote }}
- name: REACH_CONSOLE_LOGIN_RATE
  value: {{ $c.loginRate | quote }}
{{- if $c.publicUrl }}
- name: REACH_CONSOLE_PUBLIC_URL
  value: {{ $c.publicUrl | trimSuffix "/" | quote }}
{{- end }}
{{- if $c.sessionKey.existingSecret }}
- name: REACH_CONSOLE_SESSION_KEY
  valueFrom:
    secretKeyRef:
      name: {{ $c.sessionKey.existingSecret }}
      key: {{ $c.sessionKey.existingSecretKey }}
{{- end }}
{{- with $c.env }}
{{ toYaml . }}
{{- end }}
{{- end }}
