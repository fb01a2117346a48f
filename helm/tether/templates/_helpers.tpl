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

{{/* "true" when the chart installs Restate as a replicated cluster (restate.replicas of 3 and
more), "" for a single node; values a cluster cannot work with are refused, saying why. */}}
{{- define "tether.restateCluster" -}}
{{- $replicas := int .Values.restate.replicas -}}
{{- $replication := int .Values.restate.replication -}}
{{- if eq $replicas 2 -}}
{{- fail "restate.replicas=2: a replicated Restate cluster needs at least 3 nodes. Its metadata store needs a majority of its nodes up and replication 2 needs 2 live nodes to write to, so a 2-node cluster stops when either node is lost. Use 1 (a single node) or 3 or more." -}}
{{- else if gt $replicas 2 -}}
{{- if gt $replication $replicas -}}
{{- fail (printf "restate.replication=%d is more than restate.replicas=%d: a partition's log and state cannot be kept on more nodes than the cluster has." $replication $replicas) -}}
{{- else if eq $replication $replicas -}}
{{- fail (printf "restate.replication=%d with restate.replicas=%d: every node would hold every copy, so losing any one of them stops the cluster's writes. Keep restate.replication below restate.replicas (2 for 3 nodes)." $replication $replicas) -}}
{{- end -}}
true
{{- end -}}
{{- end -}}

{{/* The headless Service that gives each node of a Restate cluster its DNS name. */}}
{{- define "tether.restateClusterName" -}}{{ include "tether.name" (dict "root" . "suffix" "restate-cluster") }}{{- end -}}

{{/* Where the other nodes reach Restate node `index` (its pod, through the headless Service), fully
qualified: a name of the cluster's own domain is never looked up outside it. */}}
{{- define "tether.restateNodeAddress" -}}
{{- printf "http://%s-%d.%s.%s.svc.%s:5122/" (include "tether.restateName" .root) (int .index) (include "tether.restateClusterName" .root) .root.Release.Namespace .root.Values.restate.clusterDomain -}}
{{- end -}}

{{/* The configuration file of node `index` of a Restate cluster (restate-server --config-file):
its name (its pod's), the cluster's, its address for the other nodes, every node's address for
the replicated metadata store, and the replication of logs and partitions. Only the first node
provisions the cluster; the others wait for it and join. Settings a single node has too stay in
the environment; none of these is set there (the environment wins over the file). */}}
{{- define "tether.restateNodeConfig" -}}
{{- $root := .root -}}
{{- $addresses := list -}}
{{- range $i := until (int $root.Values.restate.replicas) -}}
{{- $addresses = append $addresses (include "tether.restateNodeAddress" (dict "root" $root "index" $i)) -}}
{{- end -}}
node-name = {{ printf "%s-%d" (include "tether.restateName" $root) (int .index) | quote }}
cluster-name = {{ $root.Release.Name | quote }}
auto-provision = {{ eq (int .index) 0 }}
default-replication = {{ int $root.Values.restate.replication }}
advertised-address = {{ include "tether.restateNodeAddress" . | quote }}

[metadata-client]
type = "replicated"
addresses = {{ toJson $addresses }}
# Metadata reads go to the metadata store's Raft leader, on one connection per node. When that
# node is lost without a reset (its pod's address goes with it), the reads queued on the
# connection each wait out the connect timeout in turn before another node is asked, and stale
# leader hints can send them back for another round: a new cluster controller's first pass reads
# every partition's (about 25 reads). A node that stops answering on an open connection is
# found by the pings. Losing the metadata leader (bench/restate_failover.py --lose
# metadata-leader), its partitions had new leaders after 52-85 s with its port blackholed and
# 12-175 s frozen at Restate's defaults (3 s, 5 s + 5 s), after 3.2-4.9 s with these. At 250 ms
# a round still took 6 s and some losses took 2-4 rounds. A connect between pods takes a
# millisecond; a failed one is retried on another node.
connect-timeout = "100ms"
keep-alive-interval = "1s"
keep-alive-timeout = "2s"

[networking]
# A lost node's pod address answers nothing (no reset): the survivors' connections to it fail
# at this timeout, not at the default 3 s, several of which lay between a node loss and its
# partitions' new leaders (measured on the e2e's real node: 6-12 s at 3 s, 0.4-2.9 s at 1 s).
connect-timeout = "1s"
{{- end -}}

{{/* Every node's configuration file, for the checksum that rolls the nodes when one changes. */}}
{{- define "tether.restateConfigFiles" -}}
{{- range $i := until (int .Values.restate.replicas) -}}
{{ include "tether.restateNodeConfig" (dict "root" $ "index" $i) }}
{{ end -}}
{{- end -}}
