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
# The scenarios are the modules of one test binary, e2e/tests/e2e/main.rs, run in two phases, each
# process with every scenario reporting (--no-fail-fast):
# 1. The migration scenarios mostly wait on controllers, so the migration:: module runs several at
#    once (SWITCHYARD_E2E_MIGRATION_THREADS), and the other simulator-based modules, with the
#    library's and binaries' unit tests, run beside it in a second process. Scenarios that must not
#    overlap take the locks of e2e/src/locks.rs, which hold across processes.
# 2. The modules that install the packaged operator (it manages every GpuPoolMigration of the
#    cluster) run after, with the cluster to themselves, one at a time (--test-threads=1, as when
#    each was a test binary of its own): they also take locks::cluster_alone.
# Each process picks its modules by skipping the others' (libtest's --skip, like its filters,
# matches a substring of a test's path, such as migration::faults::<scenario>), so the arguments
# given to this script (a filter or nothing) narrow every phase, and a module that is neither
# migration nor alone runs beside the migration scenarios.
alone=(real_nodes nvidia_dra kueue gpu_sharing demo)
modules=()
for m in "$root"/e2e/tests/e2e/*.rs "$root"/e2e/tests/e2e/*/mod.rs; do
  case "$m" in
    */main.rs) ;;
    */mod.rs) modules+=("$(basename "$(dirname "$m")")") ;;
    *) modules+=("$(basename "$m" .rs)") ;;
  esac
done
beside=() migration_skip=() beside_skip=() alone_skip=()
for name in "${modules[@]}"; do
  [ "$name" = migration ] || migration_skip+=(--skip "$name::")
  case " migration ${alone[*]} " in
    *" $name "*) beside_skip+=(--skip "$name::") ;;
    *) beside+=("$name") ;;
  esac
  case " ${alone[*]} " in *" $name "*) ;; *) alone_skip+=(--skip "$name::") ;; esac
done
# Build the test binary and the unit tests once, so the processes below only run them.
cargo test --no-run -p switchyard-e2e --lib --bins --tests
rc=0
beside_log=$(mktemp)
cargo test --no-fail-fast -p switchyard-e2e --lib --bins --test e2e -- "${beside_skip[@]}" "$@" \
  >"$beside_log" 2>&1 &
beside_pid=$!
cargo test --no-fail-fast -p switchyard-e2e --test e2e -- \
  --test-threads="${SWITCHYARD_E2E_MIGRATION_THREADS:-4}" "${migration_skip[@]}" "$@" || rc=$?
wait "$beside_pid" || rc=$?
echo "--- the unit tests and the modules that ran beside the migration scenarios (${beside[*]}):"
cat "$beside_log"
rm -f "$beside_log"
cargo test --no-fail-fast -p switchyard-e2e --test e2e -- --test-threads=1 "${alone_skip[@]}" "$@" || rc=$?
exit "$rc"
