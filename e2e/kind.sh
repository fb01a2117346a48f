#!/usr/bin/env bash
# The e2e on a kind cluster, for machines with Docker and a registry to pull from. It runs the
# same steps (e2e/steps.py) that `make e2e` runs on a real node built on the CI machine, so this
# script cannot rot unrun: only the cluster differs.
#
#   1. create a kind cluster (its CNI, kindnet, enforces NetworkPolicies; its default
#      StorageClass provisions Restate's volume);
#   2. build the image from the Dockerfile and load it into the cluster;
#   3. run e2e/steps.py against it: helm install, Prometheus, the agent in a restricted
#      namespace, a parked run surviving its pod, a signed approval, pods killed, NetworkPolicy,
#      a rollout while the operator is killed.
#
# Usage: e2e/kind.sh          (deletes the cluster at the end; KEEP=1 keeps it)
# Needs: docker, kind, kubectl, helm; `make venv` is run for the tether CLI and the steps.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CLUSTER=${CLUSTER:-tether-e2e}
IMAGE=${IMAGE:-tether:e2e}
PROMETHEUS_IMAGE=${PROMETHEUS_IMAGE:-quay.io/prometheus/prometheus:v3.16.0}
KUBECONFIG_FILE=$(mktemp)

die() { printf 'e2e: %s\n' "$*" >&2; exit 1; }

cleanup() {
  if [[ ${KEEP:-0} == 1 ]]; then
    echo "kept: kind cluster $CLUSTER (kubeconfig: $KUBECONFIG_FILE)"
  else
    kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
    rm -f "$KUBECONFIG_FILE"
  fi
}

for tool in docker kind kubectl helm; do
  command -v "$tool" >/dev/null || die "$tool is not on PATH"
done
make -C "$ROOT" venv >/dev/null
trap cleanup EXIT

printf '==> kind cluster %s\n' "$CLUSTER"
kind create cluster --name "$CLUSTER" --kubeconfig "$KUBECONFIG_FILE" --wait 180s

printf '==> image %s\n' "$IMAGE"
docker build -t "$IMAGE" "$ROOT"
kind load docker-image "$IMAGE" --name "$CLUSTER"

cd "$ROOT"
.venv/bin/python -m e2e.steps --name kind --kubeconfig "$KUBECONFIG_FILE" \
  --image "$IMAGE" --prometheus-image "$PROMETHEUS_IMAGE"
