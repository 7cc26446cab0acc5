#!/usr/bin/env bash
# `make bench`, real nodes: node start to Ready, and the resident memory of what runs on a node.
#   - start to Ready: nodes-down.sh, then nodes-up.sh from empty node state (a kubelet and a
#     containerd per node, images imported) until every node reports Ready; three runs;
#   - RSS (VmRSS from /proc) of each kubelet and containerd, and of the operator pods and an agent
#     pod, with Switchyard installed from config/ (e2e/overlays/real-nodes), NVIDIA's device plugin
#     on two nodes and the agent on the third, both on the NVML mock's two GPUs, after 20 s idle;
#   - idle CPU of NVIDIA's device plugin and of the agent over 30 s;
#   - RSS and idle CPU of NVIDIA's DRA kubelet plugin (gpu-kubelet-plugin v0.5.0, from its chart via
#     e2e/hack/render-nvidia-dra.sh) on real-node-2, on the same mock inventory, in the same run;
# One node's move, Switchyard beside the kubectl runbook, is e2e/hack/bench-real-move.sh.
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
    if [ "$(basename "$(readlink "$p/exe" 2>/dev/null)")" = "$1" ]; then echo "${p#/proc/}"; fi
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
  k delete --ignore-not-found deviceclass gpu.switchyard.dev >/dev/null 2>&1 || true
  nvidia_dra_down
  k label node real-node-2 e2e.switchyard.dev/bench- >/dev/null 2>&1 || true
  for n in "${nodes[@]}"; do
    k label node "$n" nvidia.com/gpu.present- switchyard.dev/gpu-backend- >/dev/null 2>&1 || true
    k uncordon "$n" >/dev/null 2>&1 || true
  done
}
nvidia_dra_down() {
  if [ -f "$state/bench-nvidia-dra.yaml" ]; then
    k delete --ignore-not-found --wait --timeout=120s -f "$state/bench-nvidia-dra.yaml" >/dev/null 2>&1 || true
    rm -f "$state/bench-nvidia-dra.yaml"
  fi
  k delete namespace nvidia-dra-driver-gpu --ignore-not-found --wait --timeout=120s >/dev/null 2>&1 || true
  k delete resourceslices --field-selector spec.driver=gpu.nvidia.com >/dev/null 2>&1 || true
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
# NVIDIA's DRA kubelet plugin on real-node-2, as its chart renders it but placed by a bench label.
bash e2e/hack/render-nvidia-dra.sh --set-json 'kubeletPlugin.nodeSelector={"e2e.switchyard.dev/bench":"nvidia-dra"}' \
  > "$state/bench-nvidia-dra.yaml"
k create namespace nvidia-dra-driver-gpu >/dev/null
k apply --server-side --force-conflicts -f "$state/bench-nvidia-dra.yaml" >/dev/null
k label node real-node-2 e2e.switchyard.dev/bench=nvidia-dra --overwrite >/dev/null
until [ "$(k get resourceslices --field-selector spec.driver=gpu.nvidia.com -o name | grep -c .)" -ge 1 ]; do sleep 1; done
sleep 20

for n in "${nodes[@]}"; do
  echo "$n: kubelet $(rss "$(cat "$state/pids/$n-kubelet.pid")"), containerd $(rss "$(cat "$state/pids/$n-containerd.pid")")"
done
for p in $(pid_of switchyard-operator); do echo "operator pod process $p: $(rss "$p")"; done
for p in $(pid_of switchyard-driver-agent); do echo "agent pod process $p (real-node-3, the mock's 2 GPUs through NVML, kubelet plugin on): $(rss "$p")"; done
for p in $(pid_of nvidia-device-plugin); do echo "NVIDIA device plugin pod process $p: $(rss "$p")"; done
for p in $(pid_of gpu-kubelet-plugin); do echo "NVIDIA DRA kubelet plugin pod process $p (real-node-2, the mock's 2 GPUs through NVML): $(rss "$p")"; done

# Idle CPU over 30 s, each process serving the NVML mock's two GPUs of its node: NVIDIA's device
# plugin (its health check waits on an NVML event set) and the agent (its event wait and probes).
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
dp=$(pid_of nvidia-device-plugin); dp=${dp%%$'\n'*}
agent=$(pid_of switchyard-driver-agent); agent=${agent%%$'\n'*}
nvdra=$(pid_of gpu-kubelet-plugin); nvdra=${nvdra%%$'\n'*}
dp0=$(ticks "$dp"); agent0=$(ticks "$agent"); nvdra0=$(ticks "$nvdra"); sleep 30
echo "idle CPU over 30 s (clock ticks of $(getconf CLK_TCK)/s): NVIDIA device plugin $(( $(ticks "$dp") - dp0 )), agent $(( $(ticks "$agent") - agent0 )), NVIDIA DRA kubelet plugin $(( $(ticks "$nvdra") - nvdra0 ))"
# NVIDIA's DRA driver goes before the move below: its chart's DeviceClass also maps nvidia.com/gpu.
nvidia_dra_down
k label node real-node-2 e2e.switchyard.dev/bench- >/dev/null
