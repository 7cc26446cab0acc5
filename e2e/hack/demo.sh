#!/usr/bin/env bash
# `make demo`: a live migration of a GPU pool from the NVIDIA device plugin to Switchyard's DRA
# driver, on a real v1.37.2 control plane with three real nodes (a kubelet and a containerd each).
# No keypress needed; exits 0 when the migration is done. DEMO_KEEP=1 leaves everything running.
#
# What is real: kube-apiserver, kube-scheduler, kube-controller-manager, etcd, the kubelets and
# their device and DRA managers, containerd with CDI, runc, the pod network (a bridge per node on
# this machine); Switchyard installed from config/ with kubectl (the operator as its two-replica
# Deployment with its own ServiceAccount, the agent as its DaemonSet, both from the images
# e2e/hack/build-images.sh built); `switchyard plan` and `switchyard status`; NVIDIA's device
# plugin (k8s-device-plugin v0.19.3, built from its Go module) as the device-plugin DaemonSet.
# What is fake: only the GPUs, at the lowest layer. Each node's driver root (/run/nvidia/driver,
# as under the GPU Operator) holds the NVML mock as libnvidia-ml.so.1 with two H100s
# (e2e/nvml-mock/nodes/h100x2.json) and device nodes made with mknod; NVIDIA's plugin and
# Switchyard's agent (--inventory nvml) both load that library.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
state="$root/e2e/.cluster"
nodes=(real-node-1 real-node-2 real-node-3)
cleanup() {
  if [ "${DEMO_KEEP:-0}" = 1 ]; then
    echo "demo: DEMO_KEEP=1: the cluster, Switchyard and the workloads are left running (KUBECONFIG=$state/kubeconfig)"
    return
  fi
  [ -n "${bin:-}" ] || return 0
  # Remove what the demo created, while the operator still runs to release its finalizer; the
  # workloads go before the driver, which must outlive the pods whose claims it prepared.
  k delete gpm a100-pool --ignore-not-found --wait --timeout=120s >/dev/null 2>&1 || true
  k delete namespace ml --ignore-not-found --wait --timeout=120s >/dev/null 2>&1 || true
  k delete --ignore-not-found --wait --timeout=120s -k e2e/overlays/real-nodes >/dev/null 2>&1 || true
  k delete --ignore-not-found --wait --timeout=60s -f e2e/manifests/nvidia-device-plugin.yaml >/dev/null 2>&1 || true
  k delete deviceclass gpu.switchyard.dev --ignore-not-found >/dev/null 2>&1 || true
  for n in "${nodes[@]}"; do
    k label node "$n" pool- nvidia.com/gpu.present- switchyard.dev/gpu-backend- >/dev/null 2>&1 || true
    k uncordon "$n" >/dev/null 2>&1 || true
  done
  if [ "${started_cluster:-0}" = 1 ]; then bash e2e/hack/cluster-down.sh >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
# wait_for SECONDS WHAT COMMAND...: polls COMMAND every second until it succeeds; after SECONDS it
# says what it waited for and stops the demo.
wait_for() {
  local limit=$1 what=$2 waited=0
  shift 2
  until "$@"; do
    if [ "$waited" -ge "$limit" ]; then
      echo "demo: gave up after ${limit}s waiting for $what" >&2
      exit 1
    fi
    sleep 1
    waited=$((waited + 1))
  done
}
# The images the demo runs: Switchyard's two, NVIDIA's device plugin, the workload, the sandbox.
demo_images=(switchyard-operator switchyard-driver-agent nvidia-device-plugin workload pause)
# Whether the 3 pool nodes each advertise 2 device-plugin GPUs, or N pods run in ml (each a
# command wait_for runs again, not a value read once).
all_advertise_two() {
  [ "$(k get nodes -l pool=a100 -o jsonpath='{range .items[*]}{.status.allocatable.nvidia\.com/gpu}{"\n"}{end}' 2>/dev/null | grep -c '^2$')" = 3 ]
}
running_in_ml() { [ "$(k -n ml get pods "${@:2}" --field-selector status.phase=Running --no-headers 2>/dev/null | wc -l)" = "$1" ]; }
trainer_logs() { # the first trainer pod's name and what it printed about its GPUs
  local pod claim
  pod=$(k -n ml get pods -l app=trainer --field-selector status.phase=Running -o jsonpath='{.items[0].metadata.name}')
  echo "   kubectl -n ml logs $pod   (on $(k -n ml get pod "$pod" -o jsonpath='{.spec.nodeName}'))"
  k -n ml logs "$pod" | grep -E 'NVIDIA_VISIBLE_DEVICES=|dev ' | sed 's/^/     /'
  claim=$(k -n ml get pod "$pod" -o jsonpath='{.status.extendedResourceClaimStatus.resourceClaimName}')
  echo "     generated claim: ${claim:-(none)}"
}

say "1. A real Kubernetes v1.37.2 control plane and three real nodes (first run builds them from the Go module proxy)"
t0=$(date +%s)
bin=$(bash e2e/hack/build-controlplane.sh)
node_bin=$(bash e2e/hack/build-node.sh)
built=$(cat "$(dirname "$bin")/build-seconds" 2>/dev/null || echo "?")
node_built=$(cat "$(dirname "$node_bin")/build-seconds" 2>/dev/null || echo "?")
if [ $(( $(date +%s) - t0 )) -gt 30 ]; then
  echo "   built the control plane and the node binaries in $(( $(date +%s) - t0 ))s; later runs reuse ~/.cache/switchyard"
else
  echo "   binaries cached in ~/.cache/switchyard (the first builds took ${built}s for the control plane, ${node_built}s for kubelet and containerd)"
fi
if [ -n "${SWITCHYARD_DEMO_BIN_DIR:-}" ]; then
  # The e2e test that runs the demo has built everything and imported the images already (a
  # nested cargo would wait on the lock the test run holds).
  target=$SWITCHYARD_DEMO_BIN_DIR
else
  # Only the images the demo runs, and the CLI in the same optimised build as the operator's and
  # the agent's images (no second, debug build of the workspace).
  echo "   building the images it runs (e2e/hack/build-images.sh ${demo_images[*]}) and the switchyard CLI"
  SWITCHYARD_IMAGE_CLI=1 bash e2e/hack/build-images.sh "${demo_images[@]}" 2>&1 | sed -n 's/^build-images: /     /p'
  target=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')/image
  # The real nodes import these images only.
  export SWITCHYARD_NODE_IMAGES="${demo_images[*]}"
fi
started_cluster=0
if ! { [ -f "$state/kubeconfig" ] && "$bin/kubectl" --kubeconfig "$state/kubeconfig" get --raw /readyz >/dev/null 2>&1; }; then
  bash e2e/hack/cluster-up.sh
  started_cluster=1
elif [ -z "${SWITCHYARD_DEMO_BIN_DIR:-}" ]; then
  bash e2e/hack/nodes-up.sh
fi
export KUBECONFIG="$state/kubeconfig"
k() { "$bin/kubectl" "$@"; }
switchyard() { "$target/switchyard" "$@"; }
k version 2>/dev/null | grep Server
for n in "${nodes[@]}"; do
  k get node "$n" >/dev/null 2>&1 || { echo "demo: $n is missing: the demo needs the three real nodes of 'make cluster-up'" >&2; exit 1; }
done
# A reused cluster may hold the objects of an earlier run kept with DEMO_KEEP=1.
if k get gpm a100-pool >/dev/null 2>&1; then
  k patch gpm a100-pool --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null
  k delete gpm a100-pool --wait >/dev/null
fi
k delete namespace ml --ignore-not-found --wait >/dev/null 2>&1 || true
k get nodes -o wide | sed 's/^/   /'

say "2. The GPU pool: NVIDIA's device plugin on each node, two GPUs each (NVML answered by the mock)"
for n in "${nodes[@]}"; do k label node "$n" pool=a100 nvidia.com/gpu.present=true --overwrite >/dev/null; done
k apply --server-side --force-conflicts -f e2e/manifests/nvidia-device-plugin.yaml >/dev/null
wait_for 120 "NVIDIA's device plugin to advertise 2 GPUs on each of the 3 nodes" all_advertise_two
k get nodes -l pool=a100 -o custom-columns='NODE:.metadata.name,ALLOCATABLE_NVIDIA_GPU:.status.allocatable.nvidia\.com/gpu' | sed 's/^/   /'
dp_pod=$(k -n kube-system get pods -l name=nvidia-device-plugin-ds -o jsonpath='{.items[0].metadata.name}')
echo "   kubectl -n kube-system logs $dp_pod   (NVIDIA's device plugin)"
k -n kube-system logs "$dp_pod" | grep -E 'Starting NVIDIA|discovery strategy|Starting to serve|Registered device plugin' | head -n 8 | sed 's/^/     /'

say "3. Switchyard as a cluster admin installs it: kubectl apply -k config/ (plus the GPU Operator's driver root)"
k apply --server-side --force-conflicts -k e2e/overlays/real-nodes >/dev/null
holder() { k -n switchyard-system get lease switchyard-operator -o jsonpath='{.spec.holderIdentity}' 2>/dev/null | grep -q .; }
wait_for 180 "an operator replica to take the leader lease" holder
k -n switchyard-system get pods -o wide | sed 's/^/   /'
echo "   leader: $(k -n switchyard-system get lease switchyard-operator -o jsonpath='{.spec.holderIdentity}')"

say "4. Workloads: 3 trainers asking for nvidia.com/gpu: 1 behind a PDB, 2 web pods, a GPU quota"
k create namespace ml --dry-run=client -o yaml | k apply -f - >/dev/null
k apply -n ml -f - >/dev/null <<'EOF'
apiVersion: apps/v1
kind: Deployment
metadata: {name: trainer}
spec:
  replicas: 3
  selector: {matchLabels: {app: trainer}}
  template:
    metadata: {labels: {app: trainer}}
    spec:
      nodeSelector: {pool: a100}
      containers:
      - {name: cuda, image: "switchyard.dev/e2e/gpu-workload:0.1.0", imagePullPolicy: Never, resources: {limits: {nvidia.com/gpu: "1"}}}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: trainer}
spec: {minAvailable: 2, selector: {matchLabels: {app: trainer}}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      nodeSelector: {pool: a100}
      containers: [{name: web, image: "switchyard.dev/e2e/gpu-workload:0.1.0", imagePullPolicy: Never}]
---
# A GPU budget the way many teams add one for DRA next to the old one: the inventory explains why
# that charges each migrated GPU twice, and the summary shows it happening.
apiVersion: v1
kind: ResourceQuota
metadata: {name: gpus}
spec:
  hard:
    requests.nvidia.com/gpu: "6"
    gpu.switchyard.dev.deviceclass.resource.k8s.io/devices: "6"
EOF
wait_for 180 "the 5 workload pods to run" running_in_ml 5
k -n ml get pods -o wide --no-headers | awk '{printf "   %-28s %-10s %s\n", $1, $3, $7}'
trainer_logs
gpu_before=$(k get nodes -l pool=a100 -o jsonpath='{range .items[*]}{.status.allocatable.nvidia\.com/gpu}{"\n"}{end}' | awk '{s+=$1} END {print s+0}')
web_before=$(k -n ml get pods -l app=web -o jsonpath='{.items[*].metadata.uid}')
gpu_pods_before=$(k -n ml get pods -l app=trainer -o jsonpath='{.items[*].metadata.uid}')

say "5. switchyard plan -f config/samples/gpupoolmigration.yaml (reads only; the API server validates the manifest in dry-run)"
plan_rc=0
switchyard plan -f config/samples/gpupoolmigration.yaml || plan_rc=$?
if [ "$plan_rc" != 0 ]; then
  echo "demo: switchyard plan says the migration would not go ahead (exit $plan_rc)" >&2
  exit 1
fi

say "6. The migration: kubectl apply -f config/samples/gpupoolmigration.yaml, followed by switchyard status"
start=$(date +%s)
k apply -f config/samples/gpupoolmigration.yaml
echo "   switchyard status a100-pool"
if ! switchyard status a100-pool --timeout 600; then
  echo "demo: the migration did not complete; operator logs: kubectl -n switchyard-system logs deploy/switchyard-operator" >&2
  k get gpm a100-pool -o yaml | sed -n '/^status:/,$p' >&2
  exit 1
fi
took=$(( $(date +%s) - start ))
wait_for 180 "the 3 trainers to run again" running_in_ml 3 -l app=trainer
trainer_logs

say "7. Summary"
gpu_after=$(k get resourceslices -o jsonpath='{range .items[?(@.spec.driver=="gpu.switchyard.dev")]}{range .spec.devices[*]}{.name}{"\n"}{end}{end}' | grep -c . || true)
dp_left=$(k get nodes -l pool=a100 -o jsonpath='{range .items[*]}{.status.allocatable.nvidia\.com/gpu}{"\n"}{end}' | awk '{s+=$1} END {print s+0}')
web_after=$(k -n ml get pods -l app=web -o jsonpath='{.items[*].metadata.uid}')
evicted=0
for uid in $gpu_pods_before; do k -n ml get pods -l app=trainer -o jsonpath='{.items[*].metadata.uid}' | grep -q "$uid" || evicted=$((evicted + 1)); done
claims=$(k -n ml get pods -l app=trainer -o jsonpath='{range .items[*]}{.status.extendedResourceClaimStatus.resourceClaimName}{"\n"}{end}' | grep -c . || true)
k get gpm a100-pool | sed 's/^/   /'
k get nodes -l pool=a100 -o custom-columns='NODE:.metadata.name,BACKEND:.metadata.labels.switchyard\.dev/gpu-backend,STATE:.metadata.annotations.switchyard\.dev/migration-state,UNSCHEDULABLE:.spec.unschedulable' | sed 's/^/   /'
moved=$(k get gpm a100-pool -o jsonpath='{.status.nodes.migrated}')
total=$(k get gpm a100-pool -o jsonpath='{.status.nodes.total}')
on_dra=$(k get nodes -l pool=a100,switchyard.dev/gpu-backend=dra --no-headers 2>/dev/null | wc -l)
echo "   nodes moved:            ${moved:-0} of ${total:-0} real nodes in ${took}s, $on_dra on DRA (set-up before it: $(( start - t0 ))s)"
echo "   GPU pods evicted:       $evicted (each came back with a generated ResourceClaim: $claims of 3)"
echo "   non-GPU pods evicted:   $([ "$web_before" = "$web_after" ] && echo 0 || echo 'some (unexpected)')"
echo "   GPUs before:            $gpu_before through the device plugin"
echo "   GPUs after:             $gpu_after DRA devices in ResourceSlices, $dp_left through the device plugin"
echo "   ResourceQuota ml/gpus:  $(k -n ml get resourcequota gpus -o jsonpath='requests.nvidia.com/gpu used {.status.used.requests\.nvidia\.com/gpu}, gpu.switchyard.dev.deviceclass.resource.k8s.io/devices used {.status.used.gpu\.switchyard\.dev\.deviceclass\.resource\.k8s\.io/devices}') (the same GPUs, charged under both keys, as the inventory warned)"
[ "$claims" = 3 ] && [ "$dp_left" = 0 ] && [ "$gpu_after" = "$gpu_before" ] && [ "$web_before" = "$web_after" ] \
  && [ "$moved" = 3 ] && [ "$total" = 3 ] && [ "$on_dra" = 3 ]
