#!/usr/bin/env bash
# End to end on a kind cluster, for machines with a Docker engine (CI here has none: it tests the
# same pieces against a local control plane, see tests/helm and tests/operator).
#
#   1. create a kind cluster, build the image (Dockerfile) and load it into the cluster;
#   2. helm install the chart (CRD, operator, single-node Restate with a PVC);
#   3. apply e2e/agent.yaml in a namespace that enforces the restricted Pod Security Standard
#      and wait for the DurableAgent to be Ready (its version registered with Restate);
#   4. start a run through Restate's ingress; it parks on an approval (listed by the sidecar);
#   5. kill the worker pod (SIGKILL, --force) while the run is parked; wait for its replacement;
#   6. approve through the sidecar with a signed webhook (`tether resolve`);
#   7. check the run completed and the approved tool ran exactly once, and read the metrics;
#   8. change the spec: a new version rolls out, the old one drains and is retired.
#
# Usage: e2e/kind.sh          (deletes the cluster at the end; KEEP=1 keeps it)
# Needs: docker, kind, kubectl, helm, curl, python3; `make venv` is run for the tether CLI.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CLUSTER=${CLUSTER:-tether-e2e}
IMAGE_REPO=${IMAGE_REPO:-tether}
IMAGE_TAG=${IMAGE_TAG:-e2e}
SYSTEM_NS=tether-system
NS=tether-e2e-agents
AGENT=e2e-clerk
SESSION=e2e-$RANDOM
RESTATE_PORT=${RESTATE_PORT:-18080}
SIDECAR_PORT=${SIDECAR_PORT:-18000}
TETHER=$ROOT/.venv/bin/tether
FORWARDS=()

step() { printf '\n==> %s\n' "$*"; }
die() { printf 'e2e: %s\n' "$*" >&2; exit 1; }

# wait_until <what> <seconds> <command...>: poll the command until it succeeds.
wait_until() {
  local what=$1 seconds=$2
  shift 2
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "timed out after ${seconds}s waiting for $what"
    sleep 2
  done
}

# json <python expression over `d`>: read JSON on stdin, print the expression.
json() { python3 -c "import json, sys; d = json.load(sys.stdin); print($1)"; }

status_field() { kubectl -n "$NS" get durableagent "$AGENT" -o "jsonpath={.status.$1}"; }

# forward <namespace> <service> <local:remote>: a port-forward in the background; its pid is
# left in FORWARDED (and kept in FORWARDS for the cleanup).
forward() {
  kubectl -n "$1" port-forward "svc/$2" "$3" >/dev/null 2>&1 &
  FORWARDED=$!
  FORWARDS+=("$FORWARDED")
}

cleanup() {
  local pid
  for pid in "${FORWARDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  if [[ ${KEEP:-0} == 1 ]]; then
    echo "kept: kind cluster $CLUSTER (kind delete cluster --name $CLUSTER)"
  else
    kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
  fi
}

for tool in docker kind kubectl helm curl python3; do
  command -v "$tool" >/dev/null || die "$tool is not on PATH"
done
make -C "$ROOT" venv >/dev/null
trap cleanup EXIT

step "kind cluster $CLUSTER"
kind create cluster --name "$CLUSTER" --wait 180s

step "image $IMAGE_REPO:$IMAGE_TAG"
docker build -t "$IMAGE_REPO:$IMAGE_TAG" "$ROOT"
kind load docker-image "$IMAGE_REPO:$IMAGE_TAG" --name "$CLUSTER"

step "helm install (CRD, operator, Restate)"
helm install tether "$ROOT/helm/tether" -n "$SYSTEM_NS" --create-namespace \
  --set image.repository="$IMAGE_REPO" --set image.tag="$IMAGE_TAG" --set image.pullPolicy=Never \
  --wait --timeout 5m

step "DurableAgent $AGENT in $NS (restricted pod security)"
kubectl create namespace "$NS"
kubectl label namespace "$NS" pod-security.kubernetes.io/enforce=restricted
SECRET=$(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')
kubectl -n "$NS" create secret generic e2e-webhook --from-literal=secret="$SECRET"
kubectl -n "$NS" apply -f "$ROOT/e2e/agent.yaml"
kubectl -n "$NS" wait "durableagent/$AGENT" --for=condition=Ready --timeout=5m
FIRST_VERSION=$(status_field activeVersion)
echo "active version: $FIRST_VERSION"

forward "$SYSTEM_NS" tether-restate "$RESTATE_PORT:8080"
forward "$NS" "$AGENT-sidecar" "$SIDECAR_PORT:8000"
SIDECAR_FORWARD=$FORWARDED
INGRESS=http://127.0.0.1:$RESTATE_PORT
SIDECAR=http://127.0.0.1:$SIDECAR_PORT
wait_until "Restate's ingress" 60 curl -sf "$INGRESS/restate/health"
wait_until "the sidecar" 60 curl -sf "$SIDECAR/readyz"
export TETHER_WEBHOOK_SECRET=$SECRET

step "start a run (session $SESSION); it parks on the approval of 'ship'"
INVOCATION=$(curl -sf -X POST "$INGRESS/$AGENT/$SESSION/run/send" \
  -H 'content-type: application/json' -d '{"prompt": "ship the release"}' | json 'd["invocationId"]')
echo "invocation: $INVOCATION"
parked() { "$TETHER" approvals --sidecar "$SIDECAR" | grep -q "session=$SESSION  tool=ship"; }
wait_until "the parked call" 120 parked
"$TETHER" approvals --sidecar "$SIDECAR"
AWAKEABLE=$("$TETHER" approvals --sidecar "$SIDECAR" --json |
  json "[c['awakeable_id'] for c in d['parked'] if c['session'] == '$SESSION'][0]")

step "kill the worker pod while the run is parked"
POD=$(kubectl -n "$NS" get pods -l "tether.dev/agent=$AGENT" -o jsonpath='{.items[0].metadata.name}')
kubectl -n "$NS" delete pod "$POD" --grace-period=0 --force
kubectl -n "$NS" rollout status "deployment/$AGENT-$FIRST_VERSION" --timeout=3m
# The sidecar's port-forward went with the pod: forward again, to the replacement.
kill "$SIDECAR_FORWARD" 2>/dev/null || true
wait "$SIDECAR_FORWARD" 2>/dev/null || true
forward "$NS" "$AGENT-sidecar" "$SIDECAR_PORT:8000"
wait_until "the new sidecar" 60 curl -sf "$SIDECAR/readyz"
wait_until "the call still parked after the kill" 60 parked

step "approve through the sidecar (signed webhook)"
"$TETHER" resolve "$AWAKEABLE" --sidecar "$SIDECAR" --value '{"approved": true}'
RESULT=$(curl -sf --max-time 120 "$INGRESS/restate/invocation/$INVOCATION/attach")
echo "result: $RESULT"
[[ $(json 'd["status"]' <<<"$RESULT") == completed ]] || die "the run did not complete"
[[ $(json 'd["tool_calls"]' <<<"$RESULT") == 1 ]] || die "expected exactly one tool call"
# Exactly one result for the one call in the session (no second run of `ship` after the kill).
RESULTS=$(curl -sf -X POST "$INGRESS/$AGENT/$SESSION/session" |
  json "sum(1 for t in d['turns'] for b in t['content'] if b['type'] == 'tool_result')")
[[ $RESULTS == 1 ]] || die "the session holds $RESULTS tool results, expected exactly 1"
if "$TETHER" resolve "$AWAKEABLE" --sidecar "$SIDECAR" >/dev/null; then
  die "a second resolution of the same call was accepted"
fi
curl -sf "$SIDECAR/metrics" | grep -E '^tether_(runs_total|parked_calls|webhook_requests_total)' || true

step "roll out a new version; the old one drains and is retired"
kubectl -n "$NS" patch durableagent "$AGENT" --type merge -p '{"spec": {"system": "v2"}}'
retired() {
  local active
  active=$(status_field activeVersion)
  [[ -n $active && $active != "$FIRST_VERSION" ]] &&
    ! kubectl -n "$NS" get deployment "$AGENT-$FIRST_VERSION" >/dev/null 2>&1
}
wait_until "version $FIRST_VERSION retired" 300 retired
echo "active version: $(status_field activeVersion)"

step "OK: parked, survived its pod being killed, approved by webhook, completed once, rolled out"
