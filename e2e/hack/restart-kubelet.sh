#!/usr/bin/env bash
# Restarts one real node's kubelet as an admin restarts it on a GPU node: SIGTERM, wait for it to
# exit, then the command nodes-up.sh recorded (nodes/node<N>/kubelet.cmd), in that node's mount
# namespace. Its pods keep running (containerd is not touched). Returns once the kubelet answers
# /healthz, the Node is Ready and the new process has renewed the node's Lease.
#
# --forget-device-plugin-state first removes the kubelet's device-manager checkpoint
# (/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint, the node's kubelet/device-plugins/
# here): the remedy docs/operations.md (KubeletKeepsDevicePluginGpus) gives for
# kubernetes/kubernetes#141426 on a node no device plugin serves any more.
#
#   restart-kubelet.sh real-node-<N> [--forget-device-plugin-state]
#                                    SWITCHYARD_CLUSTER_STATE (default e2e/.cluster)
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
state=${SWITCHYARD_CLUSTER_STATE:-$here/.cluster}
name=${1:?usage: restart-kubelet.sh real-node-<N> [--forget-device-plugin-state]}
forget=${2:-}
i=${name##*-}
n="$state/nodes/node$i"
pidf="$state/pids/$name"
fail() { echo "restart-kubelet: $*" >&2; exit 1; }
[ -f "$n/kubelet.cmd" ] && [ -f "$pidf-kubelet.pid" ] && [ -f "$pidf-containerd.pid" ] \
  || fail "no kubelet of $name recorded in $state (start the nodes with nodes-up.sh)"
case "$forget" in ""|--forget-device-plugin-state) ;; *) fail "unknown option $forget" ;; esac
mapfile -d '' cmd < "$n/kubelet.cmd"
kubectl="$(bash "$here/hack/build-controlplane.sh")/kubectl --kubeconfig $state/kubeconfig"

pid=$(cat "$pidf-kubelet.pid")
if kill -TERM "$pid" 2>/dev/null; then
  for _ in $(seq 1 120); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
  kill -0 "$pid" 2>/dev/null && fail "the kubelet of $name (pid $pid) did not exit within 30s"
fi
if [ "$forget" = --forget-device-plugin-state ]; then
  rm -f "$n/kubelet/device-plugins/kubelet_internal_checkpoint"
fi
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
setsid nsenter --mount="/proc/$(cat "$pidf-containerd.pid")/ns/mnt" -- "${cmd[@]}" \
  >> "$state/logs/$name-kubelet.log" 2>&1 < /dev/null 9>&- &
echo $! > "$pidf-kubelet.pid"
hport=$((10248 + 10 * i))
deadline=$(( $(date +%s) + 120 ))
# Ready, and the new kubelet has renewed its node Lease (every 10 s; the Ready condition's
# heartbeat is written only every 5 minutes). RFC 3339 times compare as strings.
until curl -fsS "http://127.0.0.1:$hport/healthz" >/dev/null 2>&1 \
  && [ "$($kubectl get node "$name" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ] \
  && [[ "$($kubectl -n kube-node-lease get lease "$name" -o jsonpath='{.spec.renewTime}')" > "$started" ]]; do
  kill -0 "$(cat "$pidf-kubelet.pid")" 2>/dev/null || fail "the kubelet of $name exited (log: $state/logs/$name-kubelet.log)"
  [ "$(date +%s)" -lt "$deadline" ] || fail "$name was not Ready within 120s of its kubelet's restart"
  sleep 0.5
done
