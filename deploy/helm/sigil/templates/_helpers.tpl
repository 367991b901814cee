{{/* Labels on every object, as the kustomize base sets them. */}}
{{- define "sigil.labels" -}}
app.kubernetes.io/name: sigil
app.kubernetes.io/part-of: sigil
{{- end }}

{{/* The webhook pods. */}}
{{- define "sigil.selector" -}}
app.kubernetes.io/name: sigil
app.kubernetes.io/component: webhook
{{- end }}

{{/* sigil's ServiceAccount as an RBAC subject. */}}
{{- define "sigil.subject" -}}
subjects:
  - kind: ServiceAccount
    name: sigil
    namespace: {{ .Release.Namespace }}
{{- end }}

{{/* Refuses values sigil would refuse at start, at render time instead. */}}
{{- define "sigil.validate" -}}
{{- if not (has .Values.certificates.mode (list "self-managed" "cert-manager" "given")) }}
{{- fail (printf "certificates.mode must be self-managed, cert-manager or given, not %q" .Values.certificates.mode) }}
{{- end }}
{{- if not (has .Values.webhook.failurePolicy (list "Fail" "Ignore")) }}
{{- fail (printf "webhook.failurePolicy must be Fail or Ignore, not %q" .Values.webhook.failurePolicy) }}
{{- end }}
{{- if lt (int .Values.replicas) 1 }}
{{- fail "replicas must be at least 1" }}
{{- end }}
{{- end }}
