#!/usr/bin/env bash
# `make demo`: a live migration of a 6-node GPU pool from the NVIDIA device plugin to Switchyard's
# DRA driver, on a real v1.37.2 control plane with simulated GPU nodes. No keypress needed; exits 0
# when the migration is done. DEMO_KEEP=1 leaves the cluster and the processes running.
#
# What is real: kube-apiserver, kube-scheduler, kube-controller-manager, etcd, the CRD, config/
# (RBAC, the agent DaemonSet, the admission policy), the switchyard-operator process, one
# switchyard-driver-agent process per migrated node. What is simulated: the kubelet
# (e2e/src/sim.rs says exactly what it fakes). The operator runs as a local process with the admin
# kubeconfig instead of its Deployment, because simulated nodes run no containers.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
state="$root/e2e/.cluster"
work=$(mktemp -d /tmp/switchyard-demo.XXXXXX)
pids=()
cleanup() {
  if [ "${DEMO_KEEP:-0}" = 1 ]; then
    echo "demo: DEMO_KEEP=1: cluster and processes (${pids[*]}) left running; logs in $work"
    return
  fi
  # On a cluster the demo did not start (the shared e2e cluster), remove what it created while the
  # operator still runs to release its finalizer.
  if [ "${started_cluster:-0}" = 0 ] && [ -n "${bin:-}" ]; then
    "$bin/kubectl" delete gpm a100-pool --ignore-not-found --wait --timeout=60s >/dev/null 2>&1 || true
    "$bin/kubectl" delete namespace ml --ignore-not-found --wait=false >/dev/null 2>&1 || true
    "$bin/kubectl" -n kube-system delete daemonset nvidia-device-plugin-daemonset --ignore-not-found >/dev/null 2>&1 || true
    "$bin/kubectl" delete deviceclass gpu.switchyard.dev --ignore-not-found >/dev/null 2>&1 || true
  fi
  # SIGTERM: the simulator stops its driver agents and deletes its nodes before exiting.
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ "${started_cluster:-0}" = 1 ] && bash e2e/hack/cluster-down.sh >/dev/null 2>&1 || true
}
trap cleanup EXIT
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "1. A real Kubernetes v1.37.2 control plane (first run builds it from the Go module proxy)"
t0=$(date +%s)
bin=$(bash e2e/hack/build-controlplane.sh)
built=$(cat "$(dirname "$bin")/build-seconds" 2>/dev/null || echo "?")
if [ $(( $(date +%s) - t0 )) -gt 30 ]; then
  echo "   built the control plane in $(( $(date +%s) - t0 ))s; later runs reuse $(dirname "$bin")"
else
  echo "   control plane binaries cached in $(dirname "$bin") (the first build took ${built}s)"
fi
started_cluster=0
if ! { [ -f "$state/kubeconfig" ] && "$bin/kubectl" --kubeconfig "$state/kubeconfig" get --raw /readyz >/dev/null 2>&1; }; then
  bash e2e/hack/cluster-up.sh
  started_cluster=1
fi
export KUBECONFIG="$state/kubeconfig"
k() { "$bin/kubectl" "$@"; }
k version 2>/dev/null | grep Server
# A reused cluster may hold the objects of an earlier run kept with DEMO_KEEP=1 (no operator runs
# now to release the finalizer, so drop it).
if k get gpm a100-pool >/dev/null 2>&1; then
  k patch gpm a100-pool --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null
  k delete gpm a100-pool --wait >/dev/null
fi
k delete namespace ml --ignore-not-found --wait >/dev/null 2>&1 || true

say "2. Switchyard: the CRD and config/ (RBAC, driver-agent DaemonSet, admission policy)"
if [ -n "${SWITCHYARD_DEMO_BIN_DIR:-}" ]; then
  # The e2e test that runs the demo has built everything already (a nested cargo would wait on
  # the lock the test run holds).
  target=$SWITCHYARD_DEMO_BIN_DIR
else
  cargo build -q -p switchyard-operator -p switchyard-driver-agent -p switchyard-e2e --bins
  target=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')/debug
fi
switchyard() { "$target/switchyard" "$@"; }
k apply --server-side -f crds/ >/dev/null
k wait --for=condition=Established crd/gpupoolmigrations.switchyard.dev >/dev/null
k apply --server-side --force-conflicts -k config/ >/dev/null
k -n switchyard-system scale deployment switchyard-operator --replicas=0 >/dev/null
k get -k config/ --no-headers 2>/dev/null | awk '{print "   " $1}'

say "3. Six simulated GPU nodes (8 GPUs each) served by the NVIDIA device plugin"
k apply -f - >/dev/null <<'EOF'
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: nvidia-device-plugin-daemonset, namespace: kube-system}
spec:
  selector: {matchLabels: {app: nvidia-device-plugin}}
  template:
    metadata: {labels: {app: nvidia-device-plugin}}
    spec:
      nodeSelector: {pool: a100}
      terminationGracePeriodSeconds: 1
      containers: [{name: plugin, image: "nvcr.io/nvidia/k8s-device-plugin:v0.17.0"}]
EOF
KUBECONFIG="$KUBECONFIG" "$target/gpu-node-sim" --instance demo --prefix a100-node --nodes 6 --gpus 8 \
  --label pool=a100 --device-plugin kube-system/nvidia-device-plugin-daemonset \
  --dra-driver switchyard-system/switchyard-driver-agent --agent-bin "$target/switchyard-driver-agent" \
  --work-dir "$work/agents" > "$work/sim.log" 2>&1 &
pids+=($!)
until [ "$(k get nodes -l pool=a100 -o jsonpath='{range .items[*]}{.status.allocatable.nvidia\.com/gpu}{"\n"}{end}' 2>/dev/null | grep -c '^8$')" = 6 ]; do sleep 1; done
k create namespace ml --dry-run=client -o yaml | k apply -f - >/dev/null
k apply -n ml -f - >/dev/null <<'EOF'
apiVersion: apps/v1
kind: Deployment
metadata: {name: trainer}
spec:
  replicas: 4
  selector: {matchLabels: {app: trainer}}
  template:
    metadata: {labels: {app: trainer}}
    spec:
      nodeSelector: {pool: a100}
      terminationGracePeriodSeconds: 1
      containers: [{name: train, image: registry.k8s.io/pause:3.10, resources: {limits: {nvidia.com/gpu: "2"}}}]
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: trainer}
spec: {minAvailable: 3, selector: {matchLabels: {app: trainer}}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      nodeSelector: {pool: a100}
      containers: [{name: web, image: registry.k8s.io/pause:3.10}]
---
# A GPU budget the way many teams add one for DRA next to the old one: the inventory explains why
# that charges each migrated GPU twice, and the summary shows it happening.
apiVersion: v1
kind: ResourceQuota
metadata: {name: gpus}
spec:
  hard:
    requests.nvidia.com/gpu: "32"
    gpu.switchyard.dev.deviceclass.resource.k8s.io/devices: "32"
EOF
until [ "$(k -n ml get pods --field-selector status.phase=Running --no-headers 2>/dev/null | wc -l)" = 7 ]; do sleep 1; done
k get nodes -l pool=a100 -o custom-columns='NODE:.metadata.name,GPUS(device plugin):.status.allocatable.nvidia\.com/gpu,BACKEND:.metadata.labels.switchyard\.dev/gpu-backend'
k -n ml get pods -o wide --no-headers | awk '{printf "   %-32s %-10s %s\n", $1, $3, $7}'
gpu_before=$(k get nodes -l pool=a100 -o jsonpath='{range .items[*]}{.status.allocatable.nvidia\.com/gpu}{"\n"}{end}' | awk '{s+=$1} END {print s+0}')
web_before=$(k -n ml get pods -l app=web -o jsonpath='{.items[*].metadata.uid}')
gpu_pods_before=$(k -n ml get pods -l app=trainer -o jsonpath='{.items[*].metadata.uid}')

say "4. switchyard plan -f config/samples/gpupoolmigration.yaml (reads only; the API server validates the manifest in dry-run)"
plan_rc=0
switchyard plan -f config/samples/gpupoolmigration.yaml || plan_rc=$?
if [ "$plan_rc" != 0 ]; then
  echo "demo: switchyard plan says the migration would not go ahead (exit $plan_rc)" >&2
  exit 1
fi

say "5. The migration: switchyard-operator (local process) and config/samples/gpupoolmigration.yaml"
"$target/switchyard-operator" --no-leader-election --namespace switchyard-system --metrics-addr 127.0.0.1:0 \
  > "$work/operator.log" 2>&1 &
pids+=($!)
start=$(date +%s)
k apply -f config/samples/gpupoolmigration.yaml
echo "   switchyard status a100-pool"
if ! switchyard status a100-pool --timeout 600; then
  echo "demo: the migration did not complete; operator log: $work/operator.log" >&2
  k get gpm a100-pool -o yaml | sed -n '/^status:/,$p' >&2
  exit 1
fi
took=$(( $(date +%s) - start ))

say "6. Summary"
gpu_after=$(k get resourceslices -o jsonpath='{range .items[?(@.spec.driver=="gpu.switchyard.dev")]}{range .spec.devices[*]}{.name}{"\n"}{end}{end}' | grep -c . || true)
dp_left=$(k get nodes -l pool=a100 -o jsonpath='{range .items[*]}{.status.allocatable.nvidia\.com/gpu}{"\n"}{end}' | awk '{s+=$1} END {print s+0}')
web_after=$(k -n ml get pods -l app=web -o jsonpath='{.items[*].metadata.uid}')
evicted=0
for uid in $gpu_pods_before; do k -n ml get pods -l app=trainer -o jsonpath='{.items[*].metadata.uid}' | grep -q "$uid" || evicted=$((evicted + 1)); done
claims=$(k -n ml get pods -l app=trainer -o jsonpath='{range .items[*]}{.status.extendedResourceClaimStatus.resourceClaimName}{"\n"}{end}' | grep -c . || true)
k get gpm a100-pool
k get nodes -l pool=a100 -o custom-columns='NODE:.metadata.name,BACKEND:.metadata.labels.switchyard\.dev/gpu-backend,STATE:.metadata.annotations.switchyard\.dev/migration-state,UNSCHEDULABLE:.spec.unschedulable'
echo "   nodes moved:            6 of 6 in ${took}s (control plane and build: $(( start - t0 ))s)"
echo "   GPU pods evicted:       $evicted (each came back with a generated ResourceClaim: $claims of 4)"
echo "   non-GPU pods evicted:   $([ "$web_before" = "$web_after" ] && echo 0 || echo 'some (unexpected)')"
echo "   GPUs before:            $gpu_before through the device plugin"
echo "   GPUs after:             $gpu_after DRA devices in ResourceSlices, $dp_left through the device plugin"
echo "   ResourceQuota ml/gpus:  $(k -n ml get resourcequota gpus -o jsonpath='requests.nvidia.com/gpu used {.status.used.requests\.nvidia\.com/gpu}, gpu.switchyard.dev.deviceclass.resource.k8s.io/devices used {.status.used.gpu\.switchyard\.dev\.deviceclass\.resource\.k8s\.io/devices}') (the same GPUs, charged under both keys, as the inventory warned)"
[ "$claims" = 4 ] && [ "$dp_left" = 0 ] && [ "$gpu_after" = "$gpu_before" ] && [ "$web_before" = "$web_after" ]
