#!/usr/bin/env bash
# `make bench`, real nodes: node start to Ready, and the resident memory of what runs on a node.
#   - start to Ready: nodes-down.sh, then nodes-up.sh from empty node state (a kubelet and a
#     containerd per node, images imported) until every node reports Ready; three runs;
#   - RSS (VmRSS from /proc) of each kubelet and containerd, and of the operator pods and an agent
#     pod, with Switchyard installed from config/ (e2e/overlays/real-nodes), NVIDIA's device plugin
#     on two nodes and the agent on the third, both on the NVML mock's two GPUs, after 20 s idle.
# Needs the running e2e cluster (bench.sh starts one). Restarts its real nodes.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
state="$root/e2e/.cluster"
cd "$root"
bin=$(bash e2e/hack/build-controlplane.sh)
k() { "$bin/kubectl" --kubeconfig "$state/kubeconfig" "$@"; }
rss() { awk '/^VmRSS:/ {printf "%.1f MiB", $2 / 1024}' "/proc/$1/status"; }
pid_of() { # binary name inside a container: the PIDs whose executable has that base name
  for p in /proc/[0-9]*; do
    [ "$(basename "$(readlink "$p/exe" 2>/dev/null)")" = "$1" ] && echo "${p#/proc/}"
  done
}

for run in 1 2 3; do
  bash e2e/hack/nodes-down.sh 2>/dev/null
  bash e2e/hack/nodes-up.sh 2>/dev/null
  echo "real nodes start to Ready (3 nodes, run $run): $(cat "$state/nodes-startup-seconds")s"
done

nodes=(real-node-1 real-node-2 real-node-3)
cleanup() {
  k delete --ignore-not-found --wait --timeout=120s -k e2e/overlays/real-nodes >/dev/null 2>&1 || true
  k delete --ignore-not-found --wait --timeout=60s -f e2e/manifests/nvidia-device-plugin.yaml >/dev/null 2>&1 || true
  for n in "${nodes[@]}"; do k label node "$n" nvidia.com/gpu.present- switchyard.dev/gpu-backend- >/dev/null 2>&1 || true; done
}
trap cleanup EXIT
for n in "${nodes[@]}"; do k label node "$n" nvidia.com/gpu.present=true --overwrite >/dev/null; done
k label node real-node-3 switchyard.dev/gpu-backend=dra --overwrite >/dev/null
# The device plugin only where the agent is not, as Managed placement would arrange it.
sed 's/^      nodeSelector:$/      affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: switchyard.dev\/gpu-backend, operator: NotIn, values: [dra]}]}]}}}\n      nodeSelector:/' \
  e2e/manifests/nvidia-device-plugin.yaml | k apply --server-side --force-conflicts -f - >/dev/null
k apply --server-side --force-conflicts -k e2e/overlays/real-nodes >/dev/null
until k -n switchyard-system get lease switchyard-operator -o jsonpath='{.spec.holderIdentity}' 2>/dev/null | grep -q .; do sleep 1; done
until [ "$(k get resourceslices -o jsonpath='{range .items[?(@.spec.nodeName=="real-node-3")]}{.metadata.name}{"\n"}{end}' | grep -c .)" -ge 1 ]; do sleep 1; done
sleep 20

for n in "${nodes[@]}"; do
  echo "$n: kubelet $(rss "$(cat "$state/pids/$n-kubelet.pid")"), containerd $(rss "$(cat "$state/pids/$n-containerd.pid")")"
done
for p in $(pid_of switchyard-operator); do echo "operator pod process $p: $(rss "$p")"; done
for p in $(pid_of switchyard-driver-agent); do echo "agent pod process $p (real-node-3, the mock's 2 GPUs through NVML, kubelet plugin on): $(rss "$p")"; done
for p in $(pid_of nvidia-device-plugin); do echo "NVIDIA device plugin pod process $p: $(rss "$p")"; done
