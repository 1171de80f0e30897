{{/* Names: <release>-rmd, or the release name when it already contains the chart name. */}}
{{- define "rmd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "rmd.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "rmd.agent.fullname" -}}{{ include "rmd.fullname" . }}-agent{{- end -}}
{{- define "rmd.operator.fullname" -}}{{ include "rmd.fullname" . }}-operator{{- end -}}

{{/* Cluster-scoped objects carry the namespace too: one release name may be installed in two namespaces. */}}
{{- define "rmd.clusterName" -}}
{{- printf "%s-%s" (include "rmd.fullname" .) .Release.Namespace | trunc 200 | trimSuffix "-" -}}
{{- end -}}

{{- define "rmd.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "rmd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: rmd-k8s
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "rmd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rmd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "rmd.agent.selectorLabels" -}}
{{ include "rmd.selectorLabels" . }}
app.kubernetes.io/component: agent
{{- end -}}

{{- define "rmd.operator.selectorLabels" -}}
{{ include "rmd.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "rmd.agent.labels" -}}
{{ include "rmd.labels" . }}
app.kubernetes.io/component: agent
{{- end -}}

{{- define "rmd.operator.labels" -}}
{{ include "rmd.labels" . }}
app.kubernetes.io/component: operator
{{- end -}}

{{/* image reference from (dict "image" .Values.X.image "root" $) */}}
{{- define "rmd.image" -}}
{{- $repo := .image.repository -}}
{{- with .root.Values.image.registry }}{{ $repo = printf "%s/%s" (trimSuffix "/" .) $repo }}{{ end -}}
{{- if .image.digest -}}
{{- printf "%s@%s" $repo .image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (default .root.Chart.AppVersion .image.tag) -}}
{{- end -}}
{{- end -}}

{{/* Where the agents' identities live: *.<domain> in their certificate, <node>.<domain> expected. */}}
{{- define "rmd.agentDomain" -}}
{{- default (printf "%s.%s.svc" (include "rmd.agent.fullname" .) .Release.Namespace) .Values.tls.agentDomain -}}
{{- end -}}

{{- define "rmd.agentServerName" -}}{node}.{{ include "rmd.agentDomain" . }}{{- end -}}

{{- define "rmd.caSecretName" -}}{{ default (printf "%s-ca" (include "rmd.fullname" .)) .Values.tls.ca.existingSecret }}{{- end -}}

{{- define "rmd.agentCertsByCSR" -}}{{ if eq .Values.tls.agentCertificates "csr" }}true{{ end }}{{- end -}}

{{- define "rmd.agent.serviceAccountName" -}}{{ include "rmd.agent.fullname" . }}{{- end -}}
{{- define "rmd.operator.serviceAccountName" -}}{{ include "rmd.operator.fullname" . }}{{- end -}}

{{/* The agent's optional features, from its settings (a setting left out is on, as in rmd-agent). */}}
{{- define "rmd.agent.enabled" -}}
{{- $s := .root.Values.agent.settings -}}
{{- if or (not (hasKey $s .name)) (index $s .name) }}true{{ end -}}
{{- end -}}

{{- define "rmd.imagePullSecrets" -}}
{{- with .Values.image.pullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end -}}

{{/*
The TLS material, computed once per render and shared by every template (cached in .Values, which all
templates of the chart share), so the DaemonSet's checksum sees the certificate the Secret holds.
Returns JSON: caCert, caKey, createCA, agentCert, agentKey, operatorCert, operatorKey.

The CA is looked up (kept across upgrades) or generated; leaf certificates are kept while the CA that issued
them is the current one, their identity is unchanged and tls.reissue is the value they were issued under.
`helm template` and client-side dry runs cannot look anything up: they always show new material.
*/}}
{{- define "rmd.tls" -}}
{{- if not (hasKey .Values "__rmdTLS") -}}
{{- $fullname := include "rmd.fullname" . -}}
{{- $ns := .Release.Namespace -}}
{{- $m := dict "createCA" (not .Values.tls.ca.existingSecret) -}}
{{- $caSecretName := default (printf "%s-ca" $fullname) .Values.tls.ca.existingSecret -}}
{{- $caSecret := lookup "v1" "Secret" $ns $caSecretName -}}
{{- $ca := dict -}}
{{- if and (dig "data" "tls.crt" "" $caSecret) (dig "data" "tls.key" "" $caSecret) -}}
{{- $ca = buildCustomCert (dig "data" "tls.crt" "" $caSecret) (dig "data" "tls.key" "" $caSecret) -}}
{{- else if .Values.tls.ca.existingSecret -}}
{{- fail (printf "tls.ca.existingSecret: Secret %s/%s is missing or lacks tls.crt and tls.key (helm template and client-side dry runs cannot read Secrets; use --dry-run=server)" $ns $caSecretName) -}}
{{- else -}}
{{- $ca = genCAWithKey (printf "%s RMD CA" $fullname) (int .Values.tls.ca.validityDays) (genPrivateKey "ecdsa") -}}
{{- end -}}
{{- $_ := set $m "caCert" $ca.Cert -}}
{{- $_ = set $m "caKey" $ca.Key -}}
{{- $days := int .Values.tls.validityDays -}}
{{- $leaves := list (dict "key" "operator" "secret" (printf "%s-operator-tls" $fullname) "cn" "rmd-operator" "dns" "rmd-operator") -}}
{{- if eq .Values.tls.agentCertificates "shared" -}}
{{- $leaves = append $leaves (dict "key" "agent" "secret" (printf "%s-agent-tls" $fullname) "cn" "rmd-agent" "dns" (printf "*.%s" (include "rmd.agentDomain" .))) -}}
{{- end -}}
{{- range $leaves -}}
{{- $old := lookup "v1" "Secret" $ns .secret -}}
{{- $keep := and
      (eq (dig "data" "ca.crt" "" $old) (b64enc $ca.Cert))
      (eq (dig "metadata" "annotations" "rmd.intel.com/identity" "" $old) .dns)
      (eq (dig "metadata" "annotations" "rmd.intel.com/reissue" "" $old) (toString $.Values.tls.reissue))
      (dig "data" "tls.crt" "" $old) (dig "data" "tls.key" "" $old) -}}
{{- if $keep -}}
{{- $_ := set $m (printf "%sCert" .key) (dig "data" "tls.crt" "" $old | b64dec) -}}
{{- $_ = set $m (printf "%sKey" .key) (dig "data" "tls.key" "" $old | b64dec) -}}
{{- else -}}
{{- $leaf := genSignedCertWithKey .cn nil (list .dns) $days $ca (genPrivateKey "ecdsa") -}}
{{- $_ := set $m (printf "%sCert" .key) $leaf.Cert -}}
{{- $_ = set $m (printf "%sKey" .key) $leaf.Key -}}
{{- end -}}
{{- end -}}
{{- $_ := set .Values "__rmdTLS" $m -}}
{{- end -}}
{{- toJson (index .Values "__rmdTLS") -}}
{{- end -}}
