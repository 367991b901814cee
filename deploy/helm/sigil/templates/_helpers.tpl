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

{{/* Kubernetes' default plural of a kind (sigil_core::walker::extract::plural). */}}
{{- define "sigil.plural" -}}
{{- $k := lower . -}}
{{- if or (hasSuffix "s" $k) (hasSuffix "x" $k) (hasSuffix "z" $k) (hasSuffix "ch" $k) (hasSuffix "sh" $k) -}}
{{ $k }}es
{{- else if regexMatch "[^aeiou]y$" $k -}}
{{ trimSuffix "y" $k }}ies
{{- else -}}
{{ $k }}s
{{- end -}}
{{- end }}

{{/* The custom resources the image extractors name, by API group: the
     shipped list (files/image-extractors.yaml, the same file sigil embeds)
     with the policy's spec.imageExtractors on top (one naming the same group
     and kind replaces it; paths: [] turns it off). A JSON object of group ->
     sorted resources, read by the webhook rules and the audit's RBAC. */}}
{{- define "sigil.customKinds" -}}
{{- $byKind := dict -}}
{{- range (.Files.Get "files/image-extractors.yaml" | fromYamlArray) -}}
{{- $_ := set $byKind (printf "%s/%s" (first (splitList "/" .apiVersion)) .kind) . -}}
{{- end -}}
{{- $pol := .Values.policy | fromYaml -}}
{{- range (dig "spec" "imageExtractors" list $pol) -}}
{{- $_ := set $byKind (printf "%s/%s" (first (splitList "/" .apiVersion)) .kind) . -}}
{{- end -}}
{{- $groups := dict -}}
{{- range $k, $e := $byKind -}}
{{- if $e.paths -}}
{{- $g := first (splitList "/" $e.apiVersion) -}}
{{- $r := $e.resource | default (include "sigil.plural" $e.kind) -}}
{{- $_ := set $groups $g (append (get $groups $g | default list) $r) -}}
{{- end -}}
{{- end -}}
{{- $out := dict -}}
{{- range $g, $rs := $groups -}}
{{- $_ := set $out $g ($rs | uniq | sortAlpha) -}}
{{- end -}}
{{- $out | toJson -}}
{{- end }}

{{/*
What the node DaemonSet reads, by namespace (YAML: NAMESPACE: {configmaps:
[...], secrets: [...]}): the policy ConfigMap, and every ConfigMap and
Secret a keyRef of the policy's cluster rules names (their verifiers' and
attestors' cosign.keyRef, notation.trustRootRefs and tsaRootRefs) or
node.keyRefs lists; a keyRef without a namespace is read in the release's.
A team's ImagePolicy (metadata.namespace set) is not enforced at nodes.
`sigil node rbac` derives the same (a test holds them equal).
*/}}
{{- define "sigil.nodeReads" -}}
{{- $own := .Release.Namespace -}}
{{- $reads := dict $own (dict "configmaps" (list "sigil-policy") "secrets" (list)) -}}
{{- $refs := list -}}
{{- range $doc := regexSplit "(?m)^---[ \\t]*$" (.Values.policy | default "") -1 -}}
{{- $d := fromYaml $doc -}}
{{- if and $d (kindIs "map" $d) (not (dig "metadata" "namespace" "" $d)) (has (get $d "kind") (list "ImagePolicy" "ClusterImagePolicy")) -}}
{{- range $rule := (dig "spec" "rules" (list) $d) -}}
{{- $specs := (get $rule "verify") | default (list) -}}
{{- range $a := ((get $rule "attestations") | default (list)) -}}
{{- $specs = concat $specs ((get $a "attestors") | default (list)) -}}
{{- end -}}
{{- range $s := $specs -}}
{{- with (dig "cosign" "keyRef" "" $s) -}}
{{- $refs = append $refs . -}}
{{- end -}}
{{- $refs = concat $refs (dig "notation" "trustRootRefs" (list) $s) (dig "notation" "tsaRootRefs" (list) $s) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $refs = concat $refs (.Values.node.keyRefs | default (list)) -}}
{{- range $r := $refs -}}
{{- $rns := (get $r "namespace") | default $own -}}
{{- if not (hasKey $reads $rns) -}}
{{- $_ := set $reads $rns (dict "configmaps" (list) "secrets" (list)) -}}
{{- end -}}
{{- $e := get $reads $rns -}}
{{- with (get $r "configMap") -}}
{{- $_ := set $e "configmaps" (append (get $e "configmaps") . | uniq) -}}
{{- end -}}
{{- with (get $r "secret") -}}
{{- $_ := set $e "secrets" (append (get $e "secrets") . | uniq) -}}
{{- end -}}
{{- end -}}
{{- toYaml $reads -}}
{{- end -}}
