#!/usr/bin/env bash
# The migration runbook of the seed articles done by hand with kubectl, one node at a time: what a
# platform team does without Switchyard. `make bench` times it beside Switchyard on the same pool
# (e2e/src/bin/bench-scale.rs).
#
# For each node, in the order given:
#   1. kubectl cordon
#   2. kubectl drain --pod-selector "$GPU_POD_SELECTOR" (the GPU pods only, as the articles say)
#   3. kubectl label: the backend label that the two DaemonSets' node affinity follows, so the
#      device plugin leaves and the DRA driver comes
#   4. wait until the node's allocatable nvidia.com/gpu is 0 (kubectl wait --for=jsonpath)
#   5. wait until the driver has published the node's ResourceSlice (polled once a second, as a
#      script must: kubectl cannot wait for an object it cannot name)
#   6. kubectl uncordon
#
# The one-time steps before it (the DeviceClass with extendedResourceName, the DaemonSets' node
# affinity) are already in place when the benchmark runs it.
#
# Environment: KUBECTL, KUBECONFIG, DRIVER (the DRA driver name), GPU_POD_SELECTOR, BACKEND_LABEL
# (key=value to set), TIMEOUT (seconds per wait, default 300). Arguments: the node names.
# Prints one line per node: "<node> <seconds>".
set -euo pipefail
: "${KUBECTL:?}" "${KUBECONFIG:?}" "${DRIVER:?}" "${GPU_POD_SELECTOR:?}" "${BACKEND_LABEL:?}"
timeout=${TIMEOUT:-300}
k() { "$KUBECTL" --kubeconfig "$KUBECONFIG" "$@"; }

for node in "$@"; do
  start=$(date +%s.%N)
  k cordon "$node" >/dev/null
  k drain "$node" --pod-selector "$GPU_POD_SELECTOR" --ignore-daemonsets --delete-emptydir-data \
    --timeout "${timeout}s" >/dev/null 2>&1
  k label node "$node" "$BACKEND_LABEL" --overwrite >/dev/null
  k wait --for=jsonpath='{.status.allocatable.nvidia\.com/gpu}'=0 "node/$node" \
    --timeout "${timeout}s" >/dev/null
  deadline=$(( $(date +%s) + timeout ))
  until [ -n "$(k get resourceslices --field-selector "spec.nodeName=$node,spec.driver=$DRIVER" -o name)" ]; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "runbook: $node published no ResourceSlice of $DRIVER within ${timeout}s" >&2
      exit 1
    fi
    sleep 1
  done
  k uncordon "$node" >/dev/null
  echo "$node $(awk "BEGIN{printf \"%.2f\", $(date +%s.%N) - $start}")"
done
