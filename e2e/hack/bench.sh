#!/usr/bin/env bash
# `make bench`: benchmarks whose figures go to docs/benchmarks.md.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
echo "== control plane: binary cache lookup (warm) and cluster start-up" >&2
start=$(date +%s.%N); bash "$root/e2e/hack/build-controlplane.sh" >/dev/null
echo "build-controlplane (warm): $(awk "BEGIN{printf \"%.3f\", $(date +%s.%N) - $start}")s"
if [ -f "$root/e2e/.cluster/kubeconfig" ]; then
  echo "cluster start-up: skipped, a cluster is running (make cluster-down first)"
else
  bash "$root/e2e/hack/cluster-up.sh" 2>/dev/null
  echo "cluster start-up: $(cat "$root/e2e/.cluster/startup-seconds")s"
  bash "$root/e2e/hack/cluster-down.sh" 2>/dev/null
fi
