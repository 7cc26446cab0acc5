#!/usr/bin/env bash
# Starts a real node on a broken machine, once per fault, and checks that nodes-up.sh stops with
# a message naming the missing piece and its fix, and leaves nothing running: no process, mount,
# cgroup or bridge of that node, and no Node object.
#
# The faults are real where the machine allows it and injected through nodes-up.sh's settings
# where breaking the machine itself would break the shared cluster too:
#   - runc missing: SWITCHYARD_RUNC names a path with no runc;
#   - no cgroup hierarchy: SWITCHYARD_CGROUP_FS names a directory with no hierarchies;
#   - a missing image: SWITCHYARD_IMAGE_DIR names an empty directory;
#   - the port taken: a listener on the node's kubelet port (real);
#   - a containerd that will not start: a config it refuses (the real containerd exits).
#
# The node is real-node-9 in a state directory of its own, beside the shared cluster's nodes,
# whose control plane (kubeconfig, pki) must be up: run-e2e.sh calls this after cluster-up.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
cluster="$here/.cluster"
[ -f "$cluster/kubeconfig" ] && [ -d "$cluster/pki" ] || {
  echo "test-node-faults: no control plane in $cluster: run 'make cluster-up' first" >&2
  exit 1
}
bin=$(bash "$here/hack/build-controlplane.sh")
kubectl() { "$bin/kubectl" --kubeconfig "$cluster/kubeconfig" "$@"; }
index=9
node="real-node-$index"
kubelet_port=$((10250 + 10 * index))
work=$(mktemp -d /tmp/switchyard-node-faults.XXXXXX)
listener=
cleanup() {
  [ -z "$listener" ] || kill "$listener" 2>/dev/null || true
  SWITCHYARD_CLUSTER_STATE="$work/state" bash "$here/hack/nodes-down.sh" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/no-cgroups" "$work/no-images"

failures=0
all_match() { # patterns (one per line, grep -E), file
  local w
  while IFS= read -r w; do grep -qE -- "$w" "$2" || return 1; done <<< "$1"
}
# case name, expected messages (grep -E, one per line), then env assignments for nodes-up.sh
check() {
  local name=$1 want=$2 rc=0 left
  shift 2
  rm -rf "$work/state"
  mkdir -p "$work/state"
  ln -s "$cluster/pki" "$work/state/pki"
  ln -s "$cluster/kubeconfig" "$work/state/kubeconfig"
  env SWITCHYARD_CLUSTER_STATE="$work/state" SWITCHYARD_NODES=1 SWITCHYARD_NODE_FIRST=$index "$@" \
    bash "$here/hack/nodes-up.sh" > "$work/out" 2>&1 || rc=$?
  left=""
  pgrep -f -- "$work/state" >/dev/null && left="$left processes:$(pgrep -f -- "$work/state" | tr '\n' ' ')"
  grep -q -- "$work/state" /proc/mounts && left="$left mounts"
  compgen -G "/sys/fs/cgroup/*/switchyard-node$index" >/dev/null && left="$left cgroups"
  ip link show "swy-node$index" >/dev/null 2>&1 && left="$left bridge"
  kubectl get node "$node" >/dev/null 2>&1 && left="$left node-object"
  if [ "$rc" = 0 ]; then
    echo "test-node-faults: FAIL $name: nodes-up.sh succeeded" >&2
    failures=$((failures + 1))
  elif ! all_match "$want" "$work/out"; then
    echo "test-node-faults: FAIL $name: no message matching each line of /$want/ in:" >&2
    sed 's/^/    /' "$work/out" >&2
    failures=$((failures + 1))
  elif [ -n "$left" ]; then
    echo "test-node-faults: FAIL $name: left running:$left" >&2
    failures=$((failures + 1))
  else
    echo "test-node-faults: ok   $name: $(grep -E -- "$(head -n1 <<< "$want")" "$work/out" | head -n1)" >&2
  fi
}

check "runc missing" "runc is missing .*make deps" SWITCHYARD_RUNC="$work/no-runc/runc"
check "no cgroup hierarchy" "no writable cgroup v1 hierarchy for 'cpu' under $work/no-cgroups" \
  SWITCHYARD_CGROUP_FS="$work/no-cgroups"
check "missing image" "image archive $work/no-images/pause.tar is missing: run 'make images'" \
  SWITCHYARD_IMAGE_DIR="$work/no-images"

busybox nc -l -p "$kubelet_port" > /dev/null 2>&1 &
listener=$!
for _ in $(seq 1 50); do (exec 3<>"/dev/tcp/127.0.0.1/$kubelet_port") 2>/dev/null && break; sleep 0.1; done
# The probe above took the listener's one connection; start it again for nodes-up.sh to find.
kill "$listener" 2>/dev/null || true
wait "$listener" 2>/dev/null || true
busybox nc -l -p "$kubelet_port" > /dev/null 2>&1 &
listener=$!
sleep 0.3
check "port taken" "port $kubelet_port for $node is already in use"
kill "$listener" 2>/dev/null || true
wait "$listener" 2>/dev/null || true
listener=

# The harness's message, and containerd's own refusal shown with it.
check "containerd will not start" "containerd of $node did not start \\(log: 
containerd: failed to unmarshal TOML" \
  SWITCHYARD_CONTAINERD_CONFIG_EXTRA="[this is not toml"

if [ "$failures" -gt 0 ]; then
  echo "test-node-faults: $failures case(s) failed" >&2
  exit 1
fi
echo "test-node-faults: 5 faults, each stopped with its message and nothing left running" >&2
