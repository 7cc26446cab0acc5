#!/usr/bin/env bash
# Runs the e2e suite against the shared real control plane. Reuses a running cluster; otherwise
# starts one and stops it afterwards (set SWITCHYARD_KEEP_CLUSTER=1 to keep it for the next run).
# A cluster that cannot start fails the run: e2e is never skipped.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
state="$root/e2e/.cluster"
started=0
# The real nodes run the images built from this checkout; nodes-up.sh imports them (again, into
# nodes that already run).
if [ "${SWITCHYARD_NODES:-3}" -gt 0 ]; then
  bash "$root/e2e/hack/build-images.sh"
  bash "$root/e2e/hack/check-images.sh"
fi
if ! { [ -f "$state/kubeconfig" ] && "$(bash "$root/e2e/hack/build-controlplane.sh")/kubectl" \
        --kubeconfig "$state/kubeconfig" get --raw /readyz >/dev/null 2>&1; }; then
  bash "$root/e2e/hack/cluster-up.sh"
  started=1
else
  bash "$root/e2e/hack/nodes-up.sh"
fi
if [ "$started" = 1 ] && [ "${SWITCHYARD_KEEP_CLUSTER:-0}" != 1 ]; then
  trap 'bash "$root/e2e/hack/cluster-down.sh"' EXIT
fi

export SWITCHYARD_E2E_KUBECONFIG="$state/kubeconfig"
cd "$root"
# A node that cannot start stops nodes-up.sh with a message and leaves nothing behind.
if [ "${SWITCHYARD_NODES:-3}" -gt 0 ]; then
  bash "$root/e2e/hack/test-node-faults.sh"
fi
bash "$root/e2e/hack/sweep.sh"
# The scenarios run the real operator and agent binaries as processes (they SIGKILL and SIGTERM
# them), so build those first and tell the tests where they are.
cargo build -p switchyard-operator -p switchyard-cli -p switchyard-driver-agent --bins
target_dir=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
export SWITCHYARD_OPERATOR_BIN="$target_dir/debug/switchyard-operator"
export SWITCHYARD_AGENT_BIN="$target_dir/debug/switchyard-driver-agent"
export SWITCHYARD_CLI_BIN="$target_dir/debug/switchyard"
# The kubelet-plugin scenario drives the agent with the kubelet's own plugin code (Go, cached).
SWITCHYARD_KUBELETPLUGIN_BIN=$(bash "$root/e2e/hack/build-kubeletplugin.sh")
export SWITCHYARD_KUBELETPLUGIN_BIN
# --no-fail-fast: every scenario file reports, not only those before the first failure. The
# migration scenarios mostly wait on controllers (the machine is 80% idle running them one at a
# time), so that file runs several at once; the others keep the default.
others=()
for t in "$root"/e2e/tests/*.rs; do
  name=$(basename "$t" .rs)
  [ "$name" = migration ] || others+=(--test "$name")
done
rc=0
cargo test --no-fail-fast -p switchyard-e2e --lib --bins "${others[@]}" -- "$@" || rc=$?
cargo test --no-fail-fast -p switchyard-e2e --test migration -- \
  --test-threads="${SWITCHYARD_E2E_MIGRATION_THREADS:-4}" "$@" || rc=$?
exit "$rc"
