{{/* Names are the release name plus a suffix, within 63 characters. */}}
{{- define "tether.name" -}}
{{- printf "%s-%s" .root.Release.Name .suffix | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tether.operatorName" -}}{{ include "tether.name" (dict "root" . "suffix" "operator") }}{{- end -}}
{{- define "tether.restateName" -}}{{ include "tether.name" (dict "root" . "suffix" "restate") }}{{- end -}}

{{/* The Secret with the key Restate signs its requests to the workers with (when the chart
installs Restate and restate.requestIdentity is on; empty otherwise). */}}
{{- define "tether.restateIdentitySecret" -}}
{{- if and (not (include "tether.restateExternal" .)) .Values.restate.requestIdentity -}}
{{ include "tether.restateName" . }}-identity
{{- end -}}
{{- end -}}

{{- define "tether.labels" -}}
app.kubernetes.io/part-of: tether
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "tether.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Either both external URLs or neither: one alone is a mistake worth stopping for. */}}
{{- define "tether.restateExternal" -}}
{{- $external := .Values.restate.external -}}
{{- if and $external.adminUrl $external.ingressUrl -}}true
{{- else if or $external.adminUrl $external.ingressUrl -}}
{{- fail "restate.external: set both adminUrl and ingressUrl to use an existing Restate, or neither to install one" -}}
{{- end -}}
{{- end -}}

{{- define "tether.restateAdminUrl" -}}
{{- if include "tether.restateExternal" . -}}{{ trimSuffix "/" .Values.restate.external.adminUrl }}
{{- else -}}{{ printf "http://%s.%s.svc:9070" (include "tether.restateName" .) .Release.Namespace }}
{{- end -}}
{{- end -}}

{{- define "tether.restateIngressUrl" -}}
{{- if include "tether.restateExternal" . -}}{{ trimSuffix "/" .Values.restate.external.ingressUrl }}
{{- else -}}{{ printf "http://%s.%s.svc:8080" (include "tether.restateName" .) .Release.Namespace }}
{{- end -}}
{{- end -}}

{{/* The restricted Pod Security Standard, for every container of the chart. */}}
{{- define "tether.containerSecurity" -}}
runAsNonRoot: true
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* The operator's pods, as a NetworkPolicy peer. */}}
{{- define "tether.operatorPeer" -}}
podSelector:
  matchLabels:
    app.kubernetes.io/instance: {{ .Release.Name }}
    app.kubernetes.io/name: tether-operator
{{- end -}}

{{/* The agents' pods, as a NetworkPolicy peer: in the namespaces the operator serves, or in
any namespace when it serves all (then any pod with these labels counts as an agent's: prefer
a list, operator.watchNamespaces). */}}
{{- define "tether.agentPeer" -}}
{{- if .Values.operator.watchNamespaces }}
namespaceSelector:
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: In
      values: {{ toJson .Values.operator.watchNamespaces }}
{{- else }}
namespaceSelector: {}
{{- end }}
podSelector:
  matchLabels:
    app.kubernetes.io/name: tether-agent
    app.kubernetes.io/managed-by: tether-operator
{{- end -}}

{{/* The egress rules every agent's pods get besides DNS (agents.egress), as the operator's
TETHER_AGENT_EGRESS: JSON NetworkPolicyEgressRules. */}}
{{- define "tether.agentEgressRules" -}}
{{- $egress := .Values.agents.egress -}}
{{- $rules := list -}}
{{- if not (include "tether.restateExternal" .) -}}
{{- $restatePods := dict "app.kubernetes.io/instance" .Release.Name "app.kubernetes.io/name" "restate" -}}
{{- $namespace := dict "kubernetes.io/metadata.name" .Release.Namespace -}}
{{- $peer := dict "namespaceSelector" (dict "matchLabels" $namespace) "podSelector" (dict "matchLabels" $restatePods) -}}
{{- $rules = append $rules (dict "to" (list $peer) "ports" (list (dict "protocol" "TCP" "port" 8080))) -}}
{{- end -}}
{{- $ports := list -}}
{{- range $egress.ports -}}
{{- $ports = append $ports (dict "protocol" "TCP" "port" .) -}}
{{- end -}}
{{- $internet := dict "ipBlock" (dict "cidr" "0.0.0.0/0" "except" $egress.privateCidrs) -}}
{{- $rules = append $rules (dict "to" (list $internet) "ports" $ports) -}}
{{- range $egress.extraRules -}}
{{- $rules = append $rules . -}}
{{- end -}}
{{- toJson $rules -}}
{{- end -}}
