#!/usr/bin/env bash
# `make bench`: benchmarks whose figures go to docs/benchmarks.md.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
state="$root/e2e/.cluster"
cd "$root"
target_dir=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')

echo "== kubelet plugin: NodePrepareResources / NodeUnprepareResources latency (no cluster needed)" >&2
# Release, as the agent ships; claims come from memory, so API-server latency is not included.
cargo build --release -p switchyard-driver-agent --example bench-prepare >&2
"$target_dir/release/examples/bench-prepare" --claims 100
"$target_dir/release/examples/bench-prepare" --claims 100 \
  --inventory "$root/driver-agent/examples/sim-inventory-mig.yaml"

echo "== operator: one reconcile's decision (pure, no API server) at 100, 1,000 and 5,000 nodes" >&2
cargo build --release -p switchyard-operator --example bench-decide >&2
"$target_dir/release/examples/bench-decide" --nodes 100,1000,5000

echo "== operator: cache memory per node and per ResourceSlice at 5,000 nodes (no API server)" >&2
cargo build --release -p switchyard-operator --example cache-footprint >&2
"$target_dir/release/examples/cache-footprint" 5000

echo "== control plane: binary cache lookup (warm) and cluster start-up" >&2
start=$(date +%s.%N); bin_dir=$(bash "$root/e2e/hack/build-controlplane.sh")
echo "build-controlplane (warm): $(awk "BEGIN{printf \"%.3f\", $(date +%s.%N) - $start}")s"
if [ -f "$state/kubeconfig" ]; then
  echo "cluster start-up: skipped, a cluster is running (make cluster-down first)"
else
  bash "$root/e2e/hack/cluster-up.sh" 2>/dev/null
  echo "cluster start-up: $(cat "$state/startup-seconds")s (control plane), $(cat "$state/nodes-startup-seconds")s (3 real nodes after it)"
  # Kept for the agent benchmark below, stopped on exit.
  trap 'bash "$root/e2e/hack/cluster-down.sh" 2>/dev/null' EXIT
fi
if ! "$bin_dir/kubectl" --kubeconfig "$state/kubeconfig" get --raw /readyz >/dev/null 2>&1; then
  echo "bench: the cluster in $state does not answer /readyz" >&2
  exit 1
fi

echo "== real nodes: start to Ready; kubelet, containerd, operator pod and agent pod memory" >&2
bash "$root/e2e/hack/build-images.sh" 2>/dev/null
bash "$root/e2e/hack/bench-real-nodes.sh"
echo "== real nodes: one node's move, Switchyard beside the kubectl runbook, step by step (5 runs)" >&2
bash "$root/e2e/hack/bench-real-move.sh" 5
echo "== real nodes: the demo's shape (3 nodes, 4 GPU pods, a PDB, a canary), Switchyard beside the kubectl runbook (5 runs)" >&2
bash "$root/e2e/hack/bench-real-move.sh" 5 pool
echo "== real nodes: one node's move onto NVIDIA's DRA driver (no interlock: Switchyard switches in sequence), beside the runbook (5 runs)" >&2
bash "$root/e2e/hack/bench-real-move.sh" 5 node nvidia
echo "== real nodes: the demo's shape onto NVIDIA's DRA driver, beside the runbook (5 runs)" >&2
bash "$root/e2e/hack/bench-real-move.sh" 5 pool nvidia

echo "== driver agent: event to taint, memory, idle CPU (8 GPUs x 7 MIG devices)" >&2
cd "$root"
# The agent as it ships (release); the measuring program's speed does not matter.
cargo build --release -p switchyard-driver-agent --bin switchyard-driver-agent >&2
cargo build -p switchyard-e2e --bin bench-agent >&2
SWITCHYARD_E2E_KUBECONFIG="$state/kubeconfig" \
SWITCHYARD_AGENT_BIN="$target_dir/release/switchyard-driver-agent" \
  "$target_dir/debug/bench-agent" --events 100 --gpus 8 --mig-per-gpu 7 --idle-seconds 30

echo "== migration engine: the 4-node scenario, wall time and operator API requests per node; switchyard plan before it" >&2
cargo build -p switchyard-operator -p switchyard-cli -p switchyard-driver-agent -p switchyard-e2e --bins >&2
SWITCHYARD_E2E_KUBECONFIG="$state/kubeconfig" \
SWITCHYARD_OPERATOR_BIN="$target_dir/debug/switchyard-operator" \
SWITCHYARD_AGENT_BIN="$target_dir/debug/switchyard-driver-agent" \
SWITCHYARD_CLI_BIN="$target_dir/debug/switchyard" \
  "$target_dir/debug/bench-migration" --runs 3

echo "== scale: SCALE=${SCALE:-100} light nodes x 10 pods; Switchyard at maxUnavailable 1 beside the kubectl runbook, the runbook on SCALE nodes 10% at a time (PARALLEL_RUNBOOK=0 leaves it out), then Switchyard at 10%" >&2
# The operator and the CLI as they ship: their memory, CPU and wall time are measured. The operator
# is its image's binary (profile "image", built by build-images.sh above), the CLI release.
cargo build --release -p switchyard-cli --bin switchyard >&2
# The simulator and the measuring loop run in the bench process: release, so that they take less
# of the two cores the control plane needs at 5,000 nodes.
cargo build --release -p switchyard-e2e --bin bench-scale >&2
SWITCHYARD_E2E_KUBECONFIG="$state/kubeconfig" \
SWITCHYARD_OPERATOR_BIN="$target_dir/image/switchyard-operator" \
SWITCHYARD_CLI_BIN="$target_dir/release/switchyard" \
  "$target_dir/release/bench-scale" --nodes "${SCALE:-100}" --serial-nodes "${SERIAL_NODES:-10}" \
  ${SCALE_DEADLINE_S:+--wide-deadline-s "$SCALE_DEADLINE_S"} \
  $([ "${PARALLEL_RUNBOOK:-1}" = 0 ] && echo --no-parallel-runbook)
