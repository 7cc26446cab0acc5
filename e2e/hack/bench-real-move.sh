#!/usr/bin/env bash
# One node's move on the real nodes, step by step: Switchyard (the packaged operator,
# e2e/overlays/real-nodes, a migration selecting one node) beside the kubectl runbook
# (e2e/hack/runbook-kubectl.sh) on the other node, in the same run, each node on NVIDIA's device
# plugin with one GPU pod that the move evicts and that comes back through a generated claim.
# Usage: bench-real-move.sh [runs] [node|pool] [agent|nvidia] (default 5 runs of the node shape onto
# Switchyard's agent). Needs the running e2e cluster with its real nodes (cluster-up.sh;
# SWITCHYARD_KEEP_CLUSTER=1 keeps one) and nothing else installed on it.
#
# The target: `agent` is Switchyard's driver agent (the packaged operator and agent,
# e2e/overlays/real-nodes); `nvidia` is NVIDIA's DRA driver v0.5.0 from its own chart
# (e2e/hack/render-nvidia-dra.sh, its kubelet plugin on nodes labelled `dra`) with the operator
# alone (e2e/overlays/nvidia-dra). NVIDIA's driver has no device-plugin interlock: Switchyard
# switches in sequence (label `none`, allocatable 0, then `dra`); the runbook labels `dra` at once,
# as the seed articles do, and the bench reports whether that let a node be served by both.
#
# The pool shape is the demo's: all three real nodes (2 GPUs each) with 4 GPU pods of one
# Deployment behind a PodDisruptionBudget of minAvailable 3 (grace period 30 s) and 2 web pods, the
# whole pool moved one node at a time with the sample's strategy (a canary on each node), by
# Switchyard and then by the runbook (the three nodes in turn), each from the same start, until
# every GPU pod runs again through a claim.
#
# Each run puts both nodes back on the device plugin first (the migration deleted, the trainer
# pods stopped, the backend label off, allocatable nvidia.com/gpu 2 again, the driver's slices
# gone, the trainer pods Running on device-plugin GPUs), then moves one node by Switchyard and, once
# its GPU pod runs again, the other by the runbook. The nodes swap roles every run.
#
# Where the time is read:
#   - Switchyard's steps from the node's events.k8s.io Events (eventTime, microseconds: each is
#     published once the step's writes landed), one migration name per run so that no event joins
#     an earlier run's series: NodeDraining (cordoned, evictions sent), NodeSwitching (labelled
#     `dra`: the agent, a driver with the device-plugin interlock, comes as the device plugin
#     leaves; a driver without it gets `none`, then `dra` at DriverStarting), NodeVerifying (a
#     canary; none here), NodeMigrated (uncordoned);
#   - the runbook's from its STEPS=1 lines (runbook-kubectl.sh);
#   - for both, what the cluster shows, from watches stamped as their lines arrive: allocatable
#     nvidia.com/gpu 0, the driver's first ResourceSlice of the node, the evicted GPU pod gone, the
#     migration's phase Completed, the GPU pod Running with its generated claim (the end point of
#     both sides);
#   - for both, at every watch event, that the node was never served by both backends (`overlaps`):
#     a Switchyard run that was fails the bench.
# Every time is on this machine's clock, which the API server shares.
set -euo pipefail

runs=${1:-5}
shape=${2:-node}
target=${3:-agent}
root=$(cd "$(dirname "$0")/../.." && pwd)
state="$root/e2e/.cluster"
cd "$root"
bin=$(bash e2e/hack/build-controlplane.sh)
k() { "$bin/kubectl" --kubeconfig "$state/kubeconfig" "$@"; }
ns=bench-move
usage() { echo "usage: bench-real-move.sh [runs] [node|pool] [agent|nvidia]" >&2; exit 2; }
case "$shape" in
  node) nodes=(real-node-1 real-node-2) ;;
  pool) nodes=(real-node-1 real-node-2 real-node-3) ;;
  *) usage ;;
esac
# The driver, Switchyard's DeviceClass for nvidia.com/gpu on it, its kubelet plugin's DaemonSet,
# and the overlay Switchyard is installed from.
nvidia_ns=nvidia-dra-driver-gpu
case "$target" in
  agent) driver=gpu.switchyard.dev class=gpu.switchyard.dev driver_ds=(switchyard-system switchyard-driver-agent)
    overlay=e2e/overlays/real-nodes ;;
  nvidia) driver=gpu.nvidia.com class=gpu.nvidia.switchyard.dev driver_ds=("$nvidia_ns" dra-driver-nvidia-gpu-kubelet-plugin)
    overlay=e2e/overlays/nvidia-dra ;;
  *) usage ;;
esac
# The pool shape's nodes carry this label; its workloads and its migration select them by it.
pool_label=e2e.switchyard.dev/bench-pool
work=$(mktemp -d)
watchers=()

load() { echo "load $(cut -d' ' -f1-3 /proc/loadavg), rustc $(pgrep -x rustc | grep -c . || true)"; }

stop_watchers() {
  for p in "${watchers[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${watchers[@]}"; do wait "$p" 2>/dev/null || true; done
  sleep 0.3 # the stampers behind them write what they still hold
  watchers=()
}
cleanup() {
  stop_watchers
  # The migrations first, while the operator runs to release its finalizer; the GPU pods before
  # the agent, which must outlive the pods whose claims it prepared.
  k delete gpm -l e2e.switchyard.dev/bench=move --ignore-not-found --wait --timeout=120s >/dev/null 2>&1 || true
  k delete namespace "$ns" --ignore-not-found --wait --timeout=120s >/dev/null 2>&1 || true
  k delete --ignore-not-found --wait --timeout=120s -k "$overlay" >/dev/null 2>&1 || true
  if [ "$target" = nvidia ]; then
    k delete namespace "$nvidia_ns" --ignore-not-found --wait --timeout=120s >/dev/null 2>&1 || true
    k delete --ignore-not-found -f "$work/nvidia-dra.yaml" >/dev/null 2>&1 || true
    k delete resourceslices --field-selector "spec.driver=$driver" >/dev/null 2>&1 || true
  fi
  k delete --ignore-not-found --wait --timeout=60s -f e2e/manifests/nvidia-device-plugin.yaml >/dev/null 2>&1 || true
  k delete --ignore-not-found deviceclass "$class" >/dev/null 2>&1 || true
  for n in "${nodes[@]}"; do
    k label node "$n" nvidia.com/gpu.present- switchyard.dev/gpu-backend- "$pool_label-" >/dev/null 2>&1 || true
    k uncordon "$n" >/dev/null 2>&1 || true
  done
  if [ -n "${BENCH_KEEP_WORK:-}" ]; then echo "bench-real-move: kept $work" >&2; else rm -rf "$work"; fi
}
fail() { echo "bench-real-move: $*" >&2; exit 1; }

# Nothing else may move these nodes or serve their GPUs meanwhile.
# (No GpuPoolMigration CRD yet reads as none.)
gpms=$(k get gpm -A -o name 2>/dev/null || true)
[ -z "$gpms" ] || fail "migrations exist already: $(tr '\n' ' ' <<<"$gpms")"
others=$(k get pods -A --no-headers -o custom-columns=NS:.metadata.namespace,NAME:.metadata.name 2>/dev/null |
  awk '$1 == "switchyard-system" || $1 == "kube-system" || $1 == "'"$ns"'" || $1 == "'"$nvidia_ns"'"' || true)
[ -z "$others" ] || fail "pods run already where the bench installs its own: $others"
trap cleanup EXIT

for n in "${nodes[@]}"; do
  k label node "$n" nvidia.com/gpu.present=true switchyard.dev/gpu-backend- --overwrite >/dev/null
done
# The device plugin only where the agent is not, as Managed placement would arrange it.
sed 's/^      nodeSelector:$/      affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: switchyard.dev\/gpu-backend, operator: NotIn, values: [dra]}]}]}}}\n      nodeSelector:/' \
  e2e/manifests/nvidia-device-plugin.yaml | k apply --server-side --force-conflicts -f - >/dev/null
k apply --server-side --force-conflicts -k "$overlay" >/dev/null
if [ "$target" = nvidia ]; then
  bash e2e/hack/render-nvidia-dra.sh > "$work/nvidia-dra.yaml"
  k create namespace "$nvidia_ns" --dry-run=client -o yaml | k apply -f - >/dev/null
  k apply --server-side --force-conflicts -f "$work/nvidia-dra.yaml" >/dev/null
fi
until k -n switchyard-system get lease switchyard-operator -o jsonpath='{.spec.holderIdentity}' 2>/dev/null | grep -q .; do sleep 1; done
k create namespace "$ns" --dry-run=client -o yaml | k apply -f - >/dev/null
if [ "$shape" = node ]; then
  for n in "${nodes[@]}"; do
    k apply -n "$ns" -f - >/dev/null <<YAML
apiVersion: apps/v1
kind: Deployment
metadata: {name: trainer-$n}
spec:
  replicas: 1
  selector: {matchLabels: {app: bench-trainer, node: $n}}
  template:
    metadata: {labels: {app: bench-trainer, node: $n}}
    spec:
      nodeSelector: {kubernetes.io/hostname: $n}
      terminationGracePeriodSeconds: 5
      containers:
      - {name: cuda, image: "switchyard.dev/e2e/gpu-workload:0.1.0", imagePullPolicy: Never, resources: {limits: {nvidia.com/gpu: "1"}}}
YAML
  done
else
  for n in "${nodes[@]}"; do k label node "$n" "$pool_label=true" --overwrite >/dev/null; done
  k apply -n "$ns" -f - >/dev/null <<YAML
apiVersion: apps/v1
kind: Deployment
metadata: {name: trainer}
spec:
  replicas: 4
  selector: {matchLabels: {app: bench-trainer}}
  template:
    metadata: {labels: {app: bench-trainer}}
    spec:
      nodeSelector: {$pool_label: "true"}
      terminationGracePeriodSeconds: 30
      containers:
      - {name: cuda, image: "switchyard.dev/e2e/gpu-workload:0.1.0", imagePullPolicy: Never, resources: {limits: {nvidia.com/gpu: "1"}}}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: trainer}
spec: {minAvailable: 3, selector: {matchLabels: {app: bench-trainer}}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 2
  selector: {matchLabels: {app: bench-web}}
  template:
    metadata: {labels: {app: bench-web}}
    spec:
      nodeSelector: {$pool_label: "true"}
      containers: [{name: web, image: "switchyard.dev/e2e/gpu-workload:0.1.0", imagePullPolicy: Never}]
YAML
fi

# Both nodes on NVIDIA's device plugin, each with its trainer pod Running on a device-plugin GPU.
# A migration deleted after Completed leaves its node on DRA (switchyard.dev/gpu-backend=dra), as
# the runbook leaves its node: the trainer pods go first (the agent unprepares their claims), then
# the label, so that the agent leaves and the device plugin comes back.
to_device_plugin() {
  k delete gpm -l e2e.switchyard.dev/bench=move --ignore-not-found --wait --timeout=120s >/dev/null
  for n in "${nodes[@]}"; do
    if [ -n "$(k get node "$n" -o jsonpath='{.metadata.labels.switchyard\.dev/gpu-backend}')" ]; then
      k -n "$ns" scale "deployment/trainer-$n" --replicas=0 >/dev/null
      pods_gone "node=$n"
      k label node "$n" switchyard.dev/gpu-backend- >/dev/null
    fi
    k uncordon "$n" >/dev/null
  done
  device_plugin_back
  for n in "${nodes[@]}"; do k -n "$ns" scale "deployment/trainer-$n" --replicas=1 >/dev/null; done
  k -n "$ns" wait --for=condition=Available deployment --all --timeout=120s >/dev/null
  for n in "${nodes[@]}"; do
    [ -z "$(k -n "$ns" get pods -l "node=$n" -o jsonpath='{.items[*].status.extendedResourceClaimStatus.resourceClaimName}')" ] ||
      fail "the trainer pod on $n runs through a claim before the move"
  done
}

# The trainer pods that `$1` selects gone, within 120 s.
pods_gone() {
  local deadline=$((SECONDS + 120))
  until [ -z "$(k -n "$ns" get pods -l "$1" -o name)" ]; do
    [ "$SECONDS" -lt "$deadline" ] || fail "pods $1 still there after 120 s"
    sleep 0.5
  done
}

# Every node's device plugin back (allocatable nvidia.com/gpu 2) and no slice of the driver left:
# a slice left over would let the next move find its driver ready before it started.
device_plugin_back() {
  local deadline=$((SECONDS + 180)) n
  for n in "${nodes[@]}"; do
    k wait --for=jsonpath='{.status.allocatable.nvidia\.com/gpu}'=2 "node/$n" --timeout=180s >/dev/null
    until [ -z "$(k get resourceslices --field-selector "spec.nodeName=$n,spec.driver=$driver" -o name)" ]; do
      [ "$SECONDS" -lt "$deadline" ] || fail "$n still has ResourceSlices of $driver"
      sleep 1
    done
  done
}

# The pool shape's start: every node on NVIDIA's device plugin, the 4 GPU pods Running on
# device-plugin GPUs (spread as the scheduler puts them), the web pods where they were.
pool_to_device_plugin() {
  k delete gpm -l e2e.switchyard.dev/bench=move --ignore-not-found --wait --timeout=120s >/dev/null
  k -n "$ns" scale deployment/trainer --replicas=0 >/dev/null
  pods_gone app=bench-trainer
  for n in "${nodes[@]}"; do
    k label node "$n" switchyard.dev/gpu-backend- >/dev/null
    k uncordon "$n" >/dev/null
  done
  device_plugin_back
  k -n "$ns" scale deployment/trainer --replicas=4 >/dev/null
  k -n "$ns" wait --for=condition=Available deployment --all --timeout=180s >/dev/null
  [ -z "$(k -n "$ns" get pods -l app=bench-trainer -o jsonpath='{.items[*].status.extendedResourceClaimStatus.resourceClaimName}')" ] ||
    fail "a trainer pod runs through a claim before the move"
}

# Watches, each line stamped with this machine's time as it arrives ($EPOCHREALTIME, no process
# per line). $! is kubectl's PID: the stamping reader ends at its EOF.
stamp() { while IFS= read -r l; do printf '%s %s\n' "$EPOCHREALTIME" "$l"; done; }
watch_to() { # file, kubectl get arguments
  local f=$1; shift
  "$bin/kubectl" --kubeconfig "$state/kubeconfig" get "$@" -w --output-watch-events > >(stamp > "$f") 2>/dev/null &
  watchers+=($!)
}
# Every ResourceSlice event as "<type> <node> <driver> <name> devs=<device>:<taint key>,...;...".
# Through jq, not a jsonpath template: kubectl's watch prints a template with `range` for its
# first event only and then nothing more, so a slice's later changes (a taint lifted) went unseen.
watch_slices_to() { # file
  "$bin/kubectl" --kubeconfig "$state/kubeconfig" get resourceslices -w --output-watch-events -o json \
    > >(jq --unbuffered -r '"\(.type) \(.object.spec.nodeName // "-") \(.object.spec.driver) \(.object.metadata.name) devs=\([.object.spec.devices[]? | "\(.name):\([.taints[]?.key + ","] | join(""));"] | join(""))"' |
      stamp > "$1") 2>/dev/null &
  watchers+=($!)
}
start_watchers() { # node, or "" for every node of the pool shape
  local nodes_sel=(node "$1") plugin_sel=(--field-selector "spec.nodeName=$1") pods_sel=(-l "node=$1")
  if [ -z "$1" ]; then nodes_sel=(nodes -l "$pool_label=true") plugin_sel=() pods_sel=(-l app=bench-trainer); fi
  watch_to "$work/node" "${nodes_sel[@]}" -o jsonpath='{.type} gpu={.object.status.allocatable.nvidia\.com/gpu} unsched={.object.spec.unschedulable} {.object.metadata.name}{"\n"}'
  watch_to "$work/plugin" -n kube-system pods -l name=nvidia-device-plugin-ds "${plugin_sel[@]}" -o jsonpath='{.type} {.object.metadata.name} del={.object.metadata.deletionTimestamp} {.object.spec.nodeName}{"\n"}'
  watch_slices_to "$work/slices"
  watch_to "$work/pods" -n "$ns" pods "${pods_sel[@]}" -o jsonpath='{.type} {.object.metadata.name} {.object.status.phase} claim={.object.status.extendedResourceClaimStatus.resourceClaimName}{"\n"}'
  watch_to "$work/gpm" gpm -o jsonpath='{.type} {.object.metadata.name} {.object.status.phase}{"\n"}'
  # The node's and the pods' have listed what is there (the others may list nothing), and every
  # watch has had time to open, before the clock starts.
  until [ -s "$work/node" ] && [ -s "$work/pods" ] && [ -s "$work/plugin" ]; do sleep 0.1; done
  sleep 0.5
}
first() { # file, awk condition on $1 (time) onwards, t0: the first stamped line from t0 on
  awk -v t0="$3" '$1 >= t0 && ('"$2"') { print $1; exit }' "$1"
}
pod_back() { first "$work/pods" '$4 == "Running" && $5 != "claim="' "$1"; }
wait_for() { # what, command: polled at 0.2 s, at most 300 s
  local what=$1 deadline=$((SECONDS + 300)); shift
  until [ -n "$("$@")" ]; do
    [ "$SECONDS" -lt "$deadline" ] || fail "no $what within 300 s"
    sleep 0.2
  done
}
d() { # from, to: seconds between two stamps; "-" where either is missing
  if [ -n "$1" ] && [ -n "$2" ]; then awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; else echo -; fi
}
# The first time from $3 on of each reason for node $1 and migration $2, as "reason unix-seconds":
# an event's eventTime, or a repeat's series.lastObservedTime (events outlive their migration, and
# a repeat of the same note joins the first event's series).
node_events() {
  k get events.events.k8s.io -A -o json | jq -r --arg n "$1" --arg m "$2" --argjson t0 "$3" '
    def ts: capture("^(?<s>[^.Z]+)(\\.(?<f>[0-9]+))?Z$") | (.s + "Z" | fromdateiso8601) + ((.f // "0") | "0." + . | tonumber);
    [.items[] | select(.regarding.kind == "Node" and .regarding.name == $n and .related.name == $m)
     | {reason, t: ([.eventTime, .series.lastObservedTime] | map(select(. != null) | ts) | map(select(. >= $t0)) | min)}
     | select(.t != null)]
    | group_by(.reason) | map(min_by(.t)) | .[] | "\(.reason) \(.t)"'
}
ev() { awk -v r="$1" '$1 == r { printf "%.6f", $2 }' "$work/events"; }

# What the watches saw from $t0 on, for node $1: the evicted GPU pod gone, the device plugin's pod
# deleted (the kubelet stops it then), allocatable nvidia.com/gpu 0, the driver's first slice, the GPU pod back through a claim.
seen() {
  gone=$(first "$work/pods" '$2 == "DELETED"' "$t0")
  plugin_stop=$(first "$work/plugin" '$2 == "DELETED" || $4 != "del="' "$t0")
  alloc0=$(first "$work/node" '$3 == "gpu=0"' "$t0")
  slice=$(first "$work/slices" '$2 == "ADDED" && $3 == "'"$1"'" && $4 == "'"$driver"'"' "$t0")
  back=$(pod_back "$t0")
}
# Safety, checked in every timed run: no moment at which node $1 advertises device-plugin GPUs
# (allocatable nvidia.com/gpu above 0) while a slice of the driver offers it a device that no
# node-wide taint keeps out (the device-plugin interlock, the kubelet plugin not registered, the
# driver stopping): the scheduler would then see the node served by both backends. Prints each such
# moment from the watches, nothing when there is none.
overlaps() {
  { awk -v n="$1" '$5 == n { print $1, "node", $3 }' "$work/node"
    awk -v n="$1" -v dr="$driver" '$3 == n && $4 == dr { print $1, "slice", $2, $5, $6 }' "$work/slices"
  } | sort -n -k1 | awk '
    $2 == "node" { split($3, a, "="); alloc = a[2] + 0 }
    $2 == "slice" {
      open[$4] = 0
      if ($3 != "DELETED") {
        k = split(substr($5, 6), devs, ";")
        for (i = 1; i <= k; i++)
          if (devs[i] != "" && devs[i] !~ /device-plugin-active|kubelet-plugin-not-registered|driver-unavailable/) open[$4]++
      }
    }
    { total = 0; for (s in open) total += open[s]
      if (alloc > 0 && total > 0) printf "%s allocatable %d, %d device(s) open\n", $1, alloc, total }'
}
# From $1 to $2 less the wait for the kubelet's next node-status update (device plugin pod deleted
# to allocatable 0; nodeStatusUpdateFrequency, 10 s): each move lands at a random phase of it, the
# largest part of the spread, the same for both sides.
less_kubelet() {
  if [ -z "$plugin_stop" ] || [ -z "$alloc0" ]; then echo -; return; fi
  d "$(awk -v a="$1" -v p="$plugin_stop" -v z="$alloc0" 'BEGIN { printf "%.6f", a + (z - p) }')" "$2"
}
row() { # file, column names, values: one line of the table, and the run's line on stdout
  local f=$1 cols=$2; shift 2
  echo "$*" >> "$f"
  paste -d= <(tr ' ' '\n' <<<"$cols") <(tr ' ' '\n' <<<"$*") | tr '\n' ' '
}

sy_cols="create>draining drain(draining>switching) draining>podGone podGone>switching switching>pluginStop pluginStop>alloc0 switching>alloc0 switching>slice ready>verifying|migrated verifying>migrated migrated>completed migrated>podRunning total(create>podRunning) create>completed total-kubeletWait"
rb_cols="cordon drain drain>podGone label label>pluginStop pluginStop>alloc0 label>alloc0 alloc0>slice uncordon uncordon>podRunning total(start>podRunning) runbook-line total-kubeletWait"
: > "$work/sy.tsv"; : > "$work/rb.tsv"

# Median and min–max of each column over the runs ("-" cells left out).
summary() { # file, column names
  local f=$1 i=0; shift
  for c in $1; do
    i=$((i + 1))
    awk -v c="$i" -v name="$c" '$c != "-" { v[n++] = $c + 0 }
      END {
        if (n == 0) { printf "  %-26s -\n", name; exit }
        for (i = 1; i < n; i++) for (j = i; j > 0 && v[j - 1] > v[j]; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
        m = n % 2 ? v[(n - 1) / 2] : (v[n / 2 - 1] + v[n / 2]) / 2
        printf "  %-26s median %6.2f s   min %6.2f  max %6.2f  (n=%d)\n", name, m, v[0], v[n - 1], n
      }' "$f"
  done
}
med() { awk -v c="$2" '{ v[n++] = $c + 0 } END { for (i = 1; i < n; i++) for (j = i; j > 0 && v[j - 1] > v[j]; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }; print n % 2 ? v[(n - 1) / 2] : (v[n / 2 - 1] + v[n / 2]) / 2 }' "$1"; }
if [ "$shape" = node ]; then
for run in $(seq 1 "$runs"); do
  if [ $((run % 2)) = 1 ]; then sy=real-node-1 rb=real-node-2; else sy=real-node-2 rb=real-node-1; fi
  to_device_plugin
  gpm=bench-move-$run

  # Switchyard.
  start_watchers "$sy"
  echo "run $run Switchyard on $sy: $(load)"
  t0=$EPOCHREALTIME
  k apply -f - >/dev/null <<YAML
apiVersion: switchyard.dev/v1alpha1
kind: GpuPoolMigration
metadata: {name: $gpm, labels: {e2e.switchyard.dev/bench: move}}
spec:
  nodeSelector: {matchLabels: {kubernetes.io/hostname: $sy}}
  resources:
  - {extendedResourceName: nvidia.com/gpu, deviceClassName: $class, selector: "device.attributes['$driver'].type == 'gpu'"}
  driver: {name: $driver, daemonSet: {namespace: ${driver_ds[0]}, name: ${driver_ds[1]}}}
  devicePlugin: {daemonSet: {namespace: kube-system, name: nvidia-device-plugin-daemonset}}
  placement: Managed
  strategy: {maxUnavailable: 1, drain: {gracePeriodSeconds: 5, timeoutSeconds: 180}}
YAML
  completed() { first "$work/gpm" '$3 == "'"$gpm"'" && $4 == "Completed"' "$t0"; }
  wait_for "phase Completed of $gpm" completed
  wait_for "GPU pod back on $sy" pod_back "$t0"
  stop_watchers
  node_events "$sy" "$gpm" "$t0" > "$work/events"
  seen "$sy"
  done_at=$(completed)
  drn=$(ev NodeDraining) sw=$(ev NodeSwitching) vf=$(ev NodeVerifying) mg=$(ev NodeMigrated)
  # Ready: the device plugin's GPUs gone from allocatable and the driver's slice seen, the later.
  ready=$(printf '%s\n' "$alloc0" "$slice" | sort -n | tail -1)
  echo "run $run Switchyard $sy: $(row "$work/sy.tsv" "$sy_cols" "$(d "$t0" "$drn")" "$(d "$drn" "$sw")" \
    "$(d "$drn" "$gone")" "$(d "$gone" "$sw")" "$(d "$sw" "$plugin_stop")" "$(d "$plugin_stop" "$alloc0")" \
    "$(d "$sw" "$alloc0")" "$(d "$sw" "$slice")" "$(d "$ready" "${vf:-$mg}")" "$(d "$vf" "$mg")" \
    "$(d "$mg" "$done_at")" "$(d "$mg" "$back")" "$(d "$t0" "$back")" "$(d "$t0" "$done_at")" \
    "$(less_kubelet "$t0" "$back")")"
  echo "  events since create: $(sort -k2 -n "$work/events" | awk -v t0="$t0" '{ printf "%s +%.2f  ", $1, $2 - t0 }')"
  both=$(overlaps "$sy")
  [ -z "$both" ] || fail "run $run: $sy was served by both backends (Switchyard): $both"
  echo "  served by both backends: never (allocatable and the slices' taints, at every watch event)"

  # The runbook, the other node, the same end point.
  start_watchers "$rb"
  echo "run $run runbook on $rb: $(load)"
  t0=$EPOCHREALTIME
  line=$(STEPS=1 KUBECTL="$bin/kubectl" KUBECONFIG="$state/kubeconfig" DRIVER=$driver \
    GPU_POD_SELECTOR=app=bench-trainer BACKEND_LABEL=switchyard.dev/gpu-backend=dra \
    bash e2e/hack/runbook-kubectl.sh "$rb" 2> "$work/steps")
  wait_for "GPU pod back on $rb" pod_back "$t0"
  stop_watchers
  seen "$rb"
  st() { awk -v s="$1" '$1 == "runbook-step" && $3 == s { print $4 }' "$work/steps"; }
  echo "run $run runbook $rb: $(row "$work/rb.tsv" "$rb_cols" "$(d "$(st start)" "$(st cordon)")" \
    "$(d "$(st cordon)" "$(st drain)")" "$(d "$(st cordon)" "$gone")" "$(d "$(st drain)" "$(st label)")" \
    "$(d "$(st label)" "$plugin_stop")" "$(d "$plugin_stop" "$alloc0")" "$(d "$(st label)" "$(st allocatable-0)")" \
    "$(d "$(st allocatable-0)" "$(st slice)")" "$(d "$(st slice)" "$(st uncordon)")" "$(d "$(st uncordon)" "$back")" \
    "$(d "$t0" "$back")" "${line#* }" "$(less_kubelet "$t0" "$back")")"
  echo "  seen since start: plugin pod deleted +$(d "$t0" "$plugin_stop"), allocatable 0 +$(d "$t0" "$alloc0"), slice +$(d "$t0" "$slice")"
  both=$(overlaps "$rb")
  echo "  served by both backends (the runbook): ${both:-never}"
done

echo "summary over $runs runs onto $driver (Switchyard and the runbook alternate between real-node-1 and real-node-2):"
echo " Switchyard:"; summary "$work/sy.tsv" "$sy_cols"
echo " kubectl runbook:"; summary "$work/rb.tsv" "$rb_cols"
sy_total=$(med "$work/sy.tsv" 13) rb_total=$(med "$work/rb.tsv" 11)
echo " Switchyard / runbook, median totals to the GPU pod Running again through a claim: ${sy_total} s / ${rb_total} s = $(awk -v a="$sy_total" -v b="$rb_total" 'BEGIN { printf "%.2f", a / b }')"
echo " Switchyard create to Completed, median: $(med "$work/sy.tsv" 14) s; $(load)"
fi

# The pool shape ----------------------------------------------------------------------------------
# Sums over the nodes (awk: bash has no floating point).
add() { awk -v a="$1" -v b="$2" 'BEGIN { if (b == "-" || b == "") print a; else printf "%.6f", a + b }'; }
latest() { printf '%s\n' "$@" | grep . | sort -n | tail -1; }
# The first time from $1 on at which the 4 GPU pods all run through a claim.
all_back() {
  awk -v t0="$1" '{ up[$3] = ($2 != "DELETED" && $4 == "Running" && $5 != "claim=") }
    $1 >= t0 { n = 0; for (p in up) n += up[p]; if (n >= 4) { print $1; exit } }' "$work/pods"
}
# Node $1's wait for the kubelet's node-status update from $t0 on: its device plugin's pod
# deleted to its allocatable nvidia.com/gpu 0.
kubelet_wait() {
  local stop zero
  stop=$(awk -v t0="$t0" -v n="$1" '$1 >= t0 && $5 == n && ($2 == "DELETED" || $4 != "del=") { print $1; exit }' "$work/plugin")
  zero=$(awk -v t0="$t0" -v n="$1" '$1 >= t0 && $5 == n && $3 == "gpu=0" { print $1; exit }' "$work/node")
  d "$stop" "$zero"
}
pool_sy_cols="create>firstDraining drainΣ switchΣ verifyΣ betweenΣ kubeletΣ lastMigrated>completed lastMigrated>allRunning total(create>done) create>completed total-kubeletΣ"
pool_rb_cols="cordonΣ drainΣ labelΣ label>alloc0Σ alloc0>sliceΣ uncordonΣ kubeletΣ lastUncordon>allRunning total(start>done) total-kubeletΣ"

pool_switchyard() { # run
  local gpm=bench-pool-$1 drain=0 switch=0 verify=0 kubelet=0 firsts=() lasts=() n drn sw vf mg both
  start_watchers ""
  echo "run $1 Switchyard, the pool: $(load)"
  t0=$EPOCHREALTIME
  k apply -f - >/dev/null <<YAML
apiVersion: switchyard.dev/v1alpha1
kind: GpuPoolMigration
metadata: {name: $gpm, labels: {e2e.switchyard.dev/bench: move}}
spec:
  nodeSelector: {matchLabels: {$pool_label: "true"}}
  resources:
  - {extendedResourceName: nvidia.com/gpu, deviceClassName: $class, selector: "device.attributes['$driver'].type == 'gpu'"}
  driver: {name: $driver, daemonSet: {namespace: ${driver_ds[0]}, name: ${driver_ds[1]}}}
  devicePlugin: {daemonSet: {namespace: kube-system, name: nvidia-device-plugin-daemonset}}
  placement: Managed
  strategy:
    maxUnavailable: 1
    drain: {podSelection: ResourceConsumers, timeoutSeconds: 600, gracePeriodSeconds: 30}
    verify: {timeoutSeconds: 600, canary: {image: registry.k8s.io/pause:3.10, command: [/pause, -v]}}
YAML
  pool_completed() { first "$work/gpm" '$3 == "'"$gpm"'" && $4 == "Completed"' "$t0"; }
  wait_for "phase Completed of $gpm" pool_completed
  wait_for "the 4 GPU pods back through claims" all_back "$t0"
  stop_watchers
  for n in "${nodes[@]}"; do
    node_events "$n" "$gpm" "$t0" > "$work/events"
    drn=$(ev NodeDraining) sw=$(ev NodeSwitching) vf=$(ev NodeVerifying) mg=$(ev NodeMigrated)
    drain=$(add "$drain" "$(d "$drn" "$sw")")
    switch=$(add "$switch" "$(d "$sw" "${vf:-$mg}")")
    verify=$(add "$verify" "$(d "$vf" "$mg")")
    kubelet=$(add "$kubelet" "$(kubelet_wait "$n")")
    firsts+=("$drn") lasts+=("$mg")
    echo "  $n: Draining +$(d "$t0" "$drn"), Switching +$(d "$t0" "$sw"), Verifying +$(d "$t0" "$vf"), Migrated +$(d "$t0" "$mg"); kubelet's wait $(kubelet_wait "$n")"
    both=$(overlaps "$n")
    [ -z "$both" ] || fail "run $1: $n was served by both backends (Switchyard): $both"
  done
  local first_drn last_mg done_at back moving
  first_drn=$(printf '%s\n' "${firsts[@]}" | grep . | sort -n | head -1)
  last_mg=$(latest "${lasts[@]}")
  done_at=$(pool_completed) back=$(all_back "$t0")
  # Done: the migration Completed and every GPU pod running through a claim, the later of the two.
  end=$(latest "$done_at" "$back")
  moving=$(awk -v a="$drain" -v b="$switch" -v c="$verify" 'BEGIN { printf "%.6f", a + b + c }')
  echo "run $1 Switchyard pool: $(row "$work/pool-sy.tsv" "$pool_sy_cols" "$(d "$t0" "$first_drn")" \
    "$(d 0 "$drain")" "$(d 0 "$switch")" "$(d 0 "$verify")" "$(d "$moving" "$(d "$t0" "$last_mg")")" "$(d 0 "$kubelet")" \
    "$(d "$last_mg" "$done_at")" "$(d "$last_mg" "$back")" "$(d "$t0" "$end")" "$(d "$t0" "$done_at")" \
    "$(d "$kubelet" "$(d "$t0" "$end")")")"
  echo "  served by both backends: never (each node's allocatable and slices, at every watch event)"
}

pool_runbook() { # run
  local sums=(0 0 0 0 0 0) steps=(start cordon drain label allocatable-0 slice uncordon) kubelet=0 lasts=() n i line both
  start_watchers ""
  echo "run $1 runbook, the pool: $(load)"
  t0=$EPOCHREALTIME
  line=$(STEPS=1 KUBECTL="$bin/kubectl" KUBECONFIG="$state/kubeconfig" DRIVER=$driver \
    GPU_POD_SELECTOR=app=bench-trainer BACKEND_LABEL=switchyard.dev/gpu-backend=dra \
    bash e2e/hack/runbook-kubectl.sh "${nodes[@]}" 2> "$work/steps")
  local ended=$EPOCHREALTIME
  wait_for "the 4 GPU pods back through claims" all_back "$t0"
  stop_watchers
  st() { awk -v n="$1" -v s="$2" '$1 == "runbook-step" && $2 == n && $3 == s { print $4 }' "$work/steps"; }
  for n in "${nodes[@]}"; do
    for i in 0 1 2 3 4 5; do
      sums[i]=$(add "${sums[i]}" "$(d "$(st "$n" "${steps[i]}")" "$(st "$n" "${steps[i + 1]}")")")
    done
    kubelet=$(add "$kubelet" "$(kubelet_wait "$n")")
    lasts+=("$(st "$n" uncordon)")
    both=$(overlaps "$n")
    echo "  $n: $(grep "^$n " <<<"$line" | cut -d' ' -f2)s by the runbook's own line; kubelet's wait $(kubelet_wait "$n"); served by both backends: ${both:-never}"
  done
  local back last end
  back=$(all_back "$t0") last=$(latest "${lasts[@]}")
  # Done: the runbook's last node uncordoned and every GPU pod running through a claim, the later.
  end=$(latest "$ended" "$back")
  echo "run $1 runbook pool: $(row "$work/pool-rb.tsv" "$pool_rb_cols" "$(d 0 "${sums[0]}")" "$(d 0 "${sums[1]}")" \
    "$(d 0 "${sums[2]}")" "$(d 0 "${sums[3]}")" "$(d 0 "${sums[4]}")" "$(d 0 "${sums[5]}")" "$(d 0 "$kubelet")" \
    "$(d "$last" "$back")" "$(d "$t0" "$end")" "$(d "$kubelet" "$(d "$t0" "$end")")")"
}

if [ "$shape" = pool ]; then
  : > "$work/pool-sy.tsv"; : > "$work/pool-rb.tsv"
  for run in $(seq 1 "$runs"); do
    pool_to_device_plugin
    pool_switchyard "$run"
    pool_to_device_plugin
    pool_runbook "$run"
  done
  echo "summary over $runs runs of the pool shape onto $driver (3 nodes, 4 GPU pods, PDB minAvailable 3; Switchyard with a canary per node):"
  echo " Switchyard:"; summary "$work/pool-sy.tsv" "$pool_sy_cols"
  echo " kubectl runbook:"; summary "$work/pool-rb.tsv" "$pool_rb_cols"
  sy_total=$(med "$work/pool-sy.tsv" 9) rb_total=$(med "$work/pool-rb.tsv" 9)
  echo " Switchyard / runbook, median totals until done (Completed, or the runbook's last uncordon) and every GPU pod Running again through a claim: ${sy_total} s / ${rb_total} s = $(awk -v a="$sy_total" -v b="$rb_total" 'BEGIN { printf "%.2f", a / b }')"
  echo " less the kubelet's waits: $(med "$work/pool-sy.tsv" 11) s / $(med "$work/pool-rb.tsv" 10) s; $(load)"
fi
