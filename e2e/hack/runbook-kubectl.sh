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
# (key=value to set), TIMEOUT (seconds per wait, default 300), STEPS (1: also a line on stderr as
# each step ends, "runbook-step <node> <step> <unix seconds>", the steps named start, cordon,
# drain, label, allocatable-0, slice, uncordon; e2e/hack/bench-real-move.sh reads them). Arguments:
# the node names.
# Prints one line per node: "<node> <seconds>"; retries of failed commands go to stderr.
set -euo pipefail
: "${KUBECTL:?}" "${KUBECONFIG:?}" "${DRIVER:?}" "${GPU_POD_SELECTOR:?}" "${BACKEND_LABEL:?}"
timeout=${TIMEOUT:-300}
k() { "$KUBECTL" --kubeconfig "$KUBECONFIG" "$@"; }

# A command the API server fails (a timeout, a dropped stream: the control plane is busy when many
# nodes move at once) is tried again, as a careful operator would: up to 5 tries, 2 s apart, each
# retry reported on stderr as "runbook: retry". Every step is safe to repeat.
errors=$(mktemp)
trap 'rm -f "$errors"' EXIT
try() {
  local n=1 out
  until out=$("$@" 2>"$errors"); do
    if [ "$n" -ge 5 ]; then
      echo "runbook: ${node:-?}: failed after $n tries: $*: $(cat "$errors")" >&2
      return 1
    fi
    echo "runbook: retry $n: ${node:-?}: $*: $(tail -1 "$errors")" >&2
    n=$((n + 1))
    sleep 2
  done
  printf '%s' "$out"
}

# $EPOCHREALTIME: no process per step, so the timed run costs the same with STEPS=1.
step() { if [ "${STEPS:-}" = 1 ]; then echo "runbook-step $node $1 $EPOCHREALTIME" >&2; fi; }

node=
for node in "$@"; do
  start=$(date +%s.%N)
  step start
  try k cordon "$node" >/dev/null
  step cordon
  try k drain "$node" --pod-selector "$GPU_POD_SELECTOR" --ignore-daemonsets --delete-emptydir-data \
    --timeout "${timeout}s" >/dev/null
  step drain
  try k label node "$node" "$BACKEND_LABEL" --overwrite >/dev/null
  step label
  try k wait --for=jsonpath='{.status.allocatable.nvidia\.com/gpu}'=0 "node/$node" \
    --timeout "${timeout}s" >/dev/null
  step allocatable-0
  deadline=$(( $(date +%s) + timeout ))
  until [ -n "$(try k get resourceslices --field-selector "spec.nodeName=$node,spec.driver=$DRIVER" -o name)" ]; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "runbook: $node published no ResourceSlice of $DRIVER within ${timeout}s" >&2
      exit 1
    fi
    sleep 1
  done
  step slice
  try k uncordon "$node" >/dev/null
  step uncordon
  echo "$node $(awk "BEGIN{printf \"%.2f\", $(date +%s.%N) - $start}")"
done
