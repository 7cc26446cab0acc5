#!/usr/bin/env bash
# Starts real worker nodes beside the e2e control plane: per node one containerd 2.x and one
# v1.37.2 kubelet (e2e/hack/build-node.sh), runc and the CNI plugins from Debian, and the images of
# e2e/hack/build-images.sh imported into that node's containerd. Called by cluster-up.sh.
#
# Several nodes share one machine, so each node runs in a mount namespace of its own (unshare),
# where its own directories are bind-mounted over the paths that the kubelet, containerd and the
# pods' hostPath volumes hard-code: /var/lib/kubelet (device-plugin and DRA plugin sockets,
# checkpoints, serving certificate), /run/containerd (shim sockets), /var/run/cdi, /var/log/pods,
# /var/log/containers, /var/lib/cni, /run/nvidia/driver and /etc/kubernetes/node-feature-discovery/
# features.d (GPU Feature Discovery's hostPath). The packaged DaemonSets therefore run unchanged.
#
# The GPUs: each node has an NVIDIA driver root at /run/nvidia/driver, laid out as the GPU
# Operator's driver container leaves one (usr/lib64/libnvidia-ml.so.1, dev/nvidia<N>, dev/nvidiactl,
# dev/nvidia-uvm, dev/nvidia-uvm-tools, usr/bin/nvidia-smi). The library is the NVML mock
# (e2e/nvml-mock; nvidia-smi is its NVML client, answering --version and -L), the device
# nodes are made with mknod (no driver answers them), and the node's GPUs are the mock's inventory
# beside the library (usr/lib64/nvml-mock.json, from $SWITCHYARD_NODE_GPUS). Faults are raised by
# appending to usr/lib64/nvml-mock.json.faults. Everything above that library is the vendors' code
# and ours, unchanged.
#
# Networking, on this machine only: the kubelets listen on this machine's own address (the kubelet
# refuses loopback as a node IP) and serve logs and exec to the API server from there. Each node's
# pods sit on a bridge of its own, swy-node<N>, 10.88.<N>.0/24. An iptables chain lets pod traffic
# reach only the pod networks and this machine (the API server through the kubernetes Service's
# address, which a DNAT rule sends to the API server, standing in for kube-proxy for that one
# Service) and drops everything else. cluster-down.sh undoes every host change recorded in
# $state/nodes/host-changes.
#
#   SWITCHYARD_NODES          how many real nodes (default 3; 0 starts none)
#   SWITCHYARD_NODE_FIRST     the index of the first node (default 1): ports, cgroup and bridge
#                             follow it, so a second set of nodes does not touch the first
#   SWITCHYARD_CLUSTER_STATE  the state directory (default e2e/.cluster); it holds the kubeconfig
#                             and the pki of the control plane
#   SWITCHYARD_RUNC           the runc binary (default: runc on PATH)
#   SWITCHYARD_CGROUP_FS      where the cgroup v1 hierarchies are mounted (default /sys/fs/cgroup)
#   SWITCHYARD_CONTAINERD_CONFIG_EXTRA  appended to each node's containerd config
#   SWITCHYARD_NODE_GPUS      the NVML mock inventory of every node (default
#                             e2e/nvml-mock/nodes/h100x2.json: two H100s)
#   SWITCHYARD_NODE_IMAGES    the images imported into each node's containerd (default: every image
#                             of build-images.sh; `make demo` names the five it runs)
# The four before the last exist for e2e/hack/test-node-faults.sh, which starts nodes on a broken machine.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
state="${SWITCHYARD_CLUSTER_STATE:-$here/.cluster}"
nodes_dir="$state/nodes"
count=${SWITCHYARD_NODES:-3}
first=${SWITCHYARD_NODE_FIRST:-1}
runc_bin=${SWITCHYARD_RUNC:-runc}
cgroup_fs=${SWITCHYARD_CGROUP_FS:-/sys/fs/cgroup}
api_port=${SWITCHYARD_APISERVER_PORT:-16443}
pki="$state/pki"
[ "$count" -gt 0 ] || exit 0

stop_started() { SWITCHYARD_CLUSTER_STATE="$state" bash "$here/hack/nodes-down.sh" >&2 || true; }
fail() { # message: stop what this run started, then exit non-zero
  failing=1
  echo "nodes-up: $*" >&2
  stop_started
  exit 1
}
# Any other failing command (set -e) stops what was started too.
on_exit() {
  local rc=$?
  if [ "$rc" != 0 ] && [ "${failing:-0}" != 1 ]; then
    echo "nodes-up: stopped by an unexpected error (exit $rc); stopping what it started" >&2
    stop_started
  fi
}
trap on_exit EXIT

# --- prerequisites, each failure naming the missing piece and its fix ------------------------
command -v "$runc_bin" >/dev/null || fail "runc is missing ($runc_bin): run 'make deps' (Debian package runc)"
runc_bin=$(command -v "$runc_bin")
for tool in unshare nsenter iptables ip jq; do
  command -v "$tool" >/dev/null || fail "$tool is missing: run 'make deps' (Debian packages util-linux, iptables, iproute2, jq)"
done
[ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] && [ -x /usr/lib/cni/loopback ] \
  || fail "the CNI plugins are missing from /usr/lib/cni: run 'make deps' (Debian package containernetworking-plugins)"
for ctrl in cpu cpuacct cpuset memory pids devices freezer; do
  [ -d "$cgroup_fs/$ctrl" ] && [ -w "$cgroup_fs/$ctrl" ] \
    || fail "no writable cgroup v1 hierarchy for '$ctrl' under $cgroup_fs: the nodes need the hybrid cgroup layout of this machine kind, as root"
done
# The address of the interface the default route uses, else the first global one.
dev=$(ip -4 route show default 2>/dev/null | awk '{for (i = 1; i < NF; i++) if ($i == "dev") {print $(i+1); exit}}')
node_ip=$(ip -4 -o addr show ${dev:+dev "$dev"} scope global 2>/dev/null | awk '{print $4}' | cut -d/ -f1 | head -n1)
[ -n "$node_ip" ] || fail "this machine has no non-loopback IPv4 address for the kubelets to listen on"

bin=$(bash "$here/hack/build-controlplane.sh")
node_bin=$(bash "$here/hack/build-node.sh")
images="${SWITCHYARD_IMAGE_DIR:-$here/../target/images}"
read -r -a node_images <<< "${SWITCHYARD_NODE_IMAGES:-pause workload nvidia-device-plugin dra-driver-nvidia-gpu kueue \
node-feature-discovery switchyard-operator switchyard-driver-agent}"
for image in "${node_images[@]}"; do
  [ -f "$images/$image.tar" ] || fail "image archive $images/$image.tar is missing: run 'make images' first"
done
kubectl() { "$bin/kubectl" --kubeconfig "$state/kubeconfig" "$@"; }
node_gpus=${SWITCHYARD_NODE_GPUS:-$here/nvml-mock/nodes/h100x2.json}
jq -e '.gpus | length > 0' "$node_gpus" >/dev/null 2>&1 \
  || fail "$node_gpus is not an NVML mock inventory with GPUs (format: e2e/nvml-mock/src/inventory.rs)"
driver_version=$(jq -r '.driverVersion // "580.95.05"' "$node_gpus")
nvml_mock=$(bash "$here/hack/build-nvml-mock.sh") || fail "the NVML mock did not build (e2e/hack/build-nvml-mock.sh)"

mkdir -p "$nodes_dir" "$state/pids" "$state/logs"
changes="$nodes_dir/host-changes"
touch "$changes"
record() { grep -qxF "$*" "$changes" || echo "$*" >> "$changes"; }

# --- host changes, each recorded for cluster-down before it is made ---------------------------
# The kubelet sets these sysctls at start (protectKernelDefaults: false); the bridge plugin turns
# on forwarding. The original values come back in cluster-down.
for key in vm.overcommit_memory kernel.panic kernel.panic_on_oops net.ipv4.ip_forward; do
  grep -q "^sysctl $key " "$changes" || echo "sysctl $key $(sysctl -n "$key")" >> "$changes"
done
for dir in /var/lib/kubelet /run/containerd /run/cdi /var/log/pods /var/log/containers /var/lib/cni \
  /run/nvidia /run/nvidia/driver /etc/kubernetes /etc/kubernetes/node-feature-discovery \
  /etc/kubernetes/node-feature-discovery/features.d; do
  if [ ! -e "$dir" ]; then mkdir -p "$dir"; record "dir $dir"; fi
done

# The kubelet adds its canary chains (KUBE-KUBELET-CANARY, KUBE-FIREWALL, KUBE-IPTABLES-HINT) when
# they are absent; remove them in cluster-down only if this run is what added them.
iptables -w -t mangle -L KUBE-KUBELET-CANARY -n >/dev/null 2>&1 || record "iptables kubelet-chains"

pod_cidr=10.88.0.0/16
svc_ip=10.96.0.1
if ! iptables -w -L SWITCHYARD-E2E-PODS -n >/dev/null 2>&1; then
  record "iptables filter SWITCHYARD-E2E-PODS"
  iptables -w -N SWITCHYARD-E2E-PODS
  iptables -w -A SWITCHYARD-E2E-PODS -d "$pod_cidr" -j ACCEPT
  iptables -w -A SWITCHYARD-E2E-PODS -j DROP
  iptables -w -I FORWARD 1 -s "$pod_cidr" -j SWITCHYARD-E2E-PODS
fi
if ! iptables -w -t nat -L SWITCHYARD-E2E-SVC -n >/dev/null 2>&1; then
  record "iptables nat SWITCHYARD-E2E-SVC"
  iptables -w -t nat -N SWITCHYARD-E2E-SVC
  iptables -w -t nat -A SWITCHYARD-E2E-SVC -d "$svc_ip/32" -p tcp --dport 443 -j DNAT --to-destination "$node_ip:$api_port"
  iptables -w -t nat -I PREROUTING 1 -s "$pod_cidr" -j SWITCHYARD-E2E-SVC
fi

# --- one node -------------------------------------------------------------------------------
# The images of build-images.sh into the node's containerd, under the names the manifests use. An
# image already there with the same digest is a no-op; a rebuilt one moves its tag.
import_images() { # index
  local n="$nodes_dir/node$1" image out
  for image in "${node_images[@]}"; do
    # ctr warns about cgroup v1 on every call; show its output only when the import fails.
    if ! out=$("$node_bin/ctr" -a "$n/run/containerd.sock" -n k8s.io images import --local "$images/$image.tar" 2>&1); then
      echo "$out" >&2
      fail "could not import $images/$image.tar into the containerd of real-node-$1"
    fi
  done
}

# The node's NVIDIA driver root (see the top of this file): the mock as libnvidia-ml.so.<version>
# with the usual .so.1 link, its inventory beside it, the device nodes a driver makes, and
# usr/bin/nvidia-smi (the mock's NVML client: --version and -L; it records each call in
# usr/lib64/nvidia-smi.calls where it can write), which NVIDIA's DRA driver runs to
# check the driver root before its kubelet plugin starts.
lay_out_driver_root() { # dir
  local r=$1 lib=usr/lib64 minor
  mkdir -p "$r/$lib" "$r/dev" "$r/usr/bin"
  install -m 0755 "$nvml_mock" "$r/$lib/libnvidia-ml.so.$driver_version"
  install -m 0755 "$(dirname "$nvml_mock")/nvidia-smi" "$r/usr/bin/nvidia-smi"
  ln -s "libnvidia-ml.so.$driver_version" "$r/$lib/libnvidia-ml.so.1"
  install -m 0644 "$node_gpus" "$r/$lib/nvml-mock.json"
  : > "$r/$lib/nvml-mock.json.faults"
  for minor in $(jq -r '.gpus | to_entries[] | .value.minor // .key' "$node_gpus"); do
    mknod -m 0666 "$r/dev/nvidia$minor" c 195 "$minor"
  done
  mknod -m 0666 "$r/dev/nvidiactl" c 195 255
  # nvidia-uvm's major is assigned when the module loads; 508 is in the dynamic range.
  mknod -m 0666 "$r/dev/nvidia-uvm" c 508 0
  mknod -m 0666 "$r/dev/nvidia-uvm-tools" c 508 1
}

start_node() { # index
  local i=$1 name="real-node-$1" n="$nodes_dir/node$1" pidf
  local kport=$((10250 + 10 * i)) hport=$((10248 + 10 * i)) cg="/switchyard-node$i"
  pidf="$state/pids/$name"
  if kill -0 "$(cat "$pidf-kubelet.pid" 2>/dev/null)" 2>/dev/null && kill -0 "$(cat "$pidf-containerd.pid" 2>/dev/null)" 2>/dev/null; then
    import_images "$i" # running already (cluster-up on a healthy cluster): bring the images up to date
    return 0
  fi
  for port in "$kport" "$hport"; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || (exec 3<>"/dev/tcp/$node_ip/$port") 2>/dev/null; then
      fail "port $port for $name is already in use (another e2e cluster? 'make cluster-down' in its checkout)"
    fi
  done
  # A node starts empty, like the control plane's etcd: no pods, claims or checkpoints of an earlier
  # cluster. The client certificate is kept. Its Node object goes too: a kubelet that finds its
  # Node keeps the device-plugin capacity and allocatable recorded there until a plugin registers
  # again, so a node whose plugin no longer finds a GPU would still show the old run's GPUs.
  kubectl delete node "$name" --ignore-not-found --wait=true --timeout=60s >/dev/null 2>&1 \
    || fail "could not delete the Node $name left by an earlier run"
  rm -rf "$n"/{kubelet,run,cdi,log-pods,log-containers,cni-lib,cni-conf,containerd,driver-root,nfd-features}
  mkdir -p "$n"/{kubelet,run,cdi,log-pods,log-containers,cni-lib,cni-conf,containerd/root,containerd/state,containerd/opt,pki} \
    "$n/nfd-features"
  lay_out_driver_root "$n/driver-root"

  # Client certificate for the Node authorizer and NodeRestriction: CN=system:node:<name>.
  if [ ! -f "$n/pki/kubelet.crt" ]; then
    openssl req -newkey rsa:2048 -nodes -subj "/O=system:nodes/CN=system:node:$name" \
      -keyout "$n/pki/kubelet.key" -out "$n/pki/kubelet.csr" 2>/dev/null
    openssl x509 -req -in "$n/pki/kubelet.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
      -days 3650 -extfile <(echo "extendedKeyUsage=clientAuth") -out "$n/pki/kubelet.crt" 2>/dev/null
  fi
  cat > "$n/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: switchyard-e2e
  cluster: {server: "https://127.0.0.1:$api_port", certificate-authority: "$pki/ca.crt"}
users:
- name: $name
  user: {client-certificate: "$n/pki/kubelet.crt", client-key: "$n/pki/kubelet.key"}
contexts:
- name: switchyard-e2e
  context: {cluster: switchyard-e2e, user: $name}
current-context: switchyard-e2e
EOF

  cat > "$n/cni-conf/10-bridge.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "swy-node$i",
  "plugins": [
    {"type": "bridge", "bridge": "swy-node$i", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "$n/cni-lib/networks",
              "ranges": [[{"subnet": "10.88.$i.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
  record "link swy-node$i"

  # restrict_oom_score_adj: this machine has no CAP_SYS_RESOURCE, so runc may not lower a
  # container's oom_score_adj below its own; without it every sandbox fails to start.
  cat > "$n/containerd.toml" <<EOF
version = 3
root = "$n/containerd/root"
state = "$n/containerd/state"
[grpc]
  address = "$n/run/containerd.sock"
[ttrpc]
  address = "$n/run/containerd.sock.ttrpc"
[plugins.'io.containerd.nri.v1.nri']
  disable = true
[plugins.'io.containerd.internal.v1.opt']
  path = "$n/containerd/opt"
[plugins.'io.containerd.cri.v1.images']
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "registry.k8s.io/pause:3.10"
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  disable_hugetlb_controller = true
  tolerate_missing_hugetlb_controller = true
  cdi_spec_dirs = ["/var/run/cdi"]
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "$n/cni-conf"
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      SystemdCgroup = false
      BinaryName = "$runc_bin"
      Root = "$n/containerd/state/runc"
${SWITCHYARD_CONTAINERD_CONFIG_EXTRA:-}
EOF

  cat > "$n/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine kind runs cgroup v1 (hybrid); v1.37 kubelets refuse it unless told otherwise.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: $cg
address: $node_ip
port: $kport
healthzBindAddress: 127.0.0.1
healthzPort: $hport
readOnlyPort: 0
containerRuntimeEndpoint: unix://$n/run/containerd.sock
# The API server calls kubelets without a client certificate (logs, exec).
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
failSwapOn: false
# No registry to pull an evicted image back from: never garbage-collect images.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# Three nodes share one small disk and 24 GiB: eviction by pressure would only add noise.
evictionHard: {memory.available: "1Mi", nodefs.available: "1%", nodefs.inodesFree: "1%", imagefs.available: "1%"}
oomScoreAdj: 0
serializeImagePulls: false
registerNode: true
EOF

  # Per-node cgroups in every v1 hierarchy; cpuset needs its cpus and mems before use.
  local ctrl
  for ctrl in cpu cpuacct cpuset memory pids devices freezer blkio systemd; do
    [ -d "/sys/fs/cgroup/$ctrl" ] || continue
    mkdir -p "/sys/fs/cgroup/$ctrl$cg"
    if [ "$ctrl" = cpuset ]; then
      cat /sys/fs/cgroup/cpuset/cpuset.cpus > "/sys/fs/cgroup/cpuset$cg/cpuset.cpus"
      cat /sys/fs/cgroup/cpuset/cpuset.mems > "/sys/fs/cgroup/cpuset$cg/cpuset.mems"
    fi
  done
  record "cgroup $cg"

  # containerd in a new mount namespace; the kubelet joins that namespace below.
  setsid unshare --mount --propagation slave -- bash -c '
    set -e
    n=$1
    mount --bind "$n/kubelet" /var/lib/kubelet
    mount --bind "$n/run" /run/containerd
    mount --bind "$n/cdi" /run/cdi
    mount --bind "$n/log-pods" /var/log/pods
    mount --bind "$n/log-containers" /var/log/containers
    mount --bind "$n/cni-lib" /var/lib/cni
    mount --bind "$n/driver-root" /run/nvidia/driver
    mount --bind "$n/nfd-features" /etc/kubernetes/node-feature-discovery/features.d
    # Shared inside the node, as systemd leaves a host: pods that mount a host path with
    # HostToContainer or Bidirectional propagation (the DRA driver of NVIDIA: /run/nvidia and the
    # plugins dir of the kubelet) need it. A peer group of this namespace only: nothing propagates
    # to the host.
    mount --make-rshared /
    exec "$2/containerd" --config "$n/containerd.toml"
  ' node-ns "$n" "$node_bin" > "$state/logs/$name-containerd.log" 2>&1 < /dev/null 9>&- &
  echo $! > "$pidf-containerd.pid"
  local deadline=$(( $(date +%s) + 30 ))
  until "$node_bin/ctr" -a "$n/run/containerd.sock" version >/dev/null 2>&1; do
    if ! kill -0 "$(cat "$pidf-containerd.pid")" 2>/dev/null || [ "$(date +%s)" -ge "$deadline" ]; then
      tail -n 20 "$state/logs/$name-containerd.log" >&2
      fail "containerd of $name did not start (log: $state/logs/$name-containerd.log)"
    fi
    sleep 0.2
  done

  import_images "$i"

  # The kubelet's command, kept for restart-kubelet.sh (NUL-separated, as restart-apiserver.sh's).
  local kubelet_cmd=("$node_bin/kubelet" --config "$n/kubelet.yaml" --kubeconfig "$n/kubeconfig"
    --hostname-override "$name" --node-ip "$node_ip" --node-labels "e2e.switchyard.dev/real-node=true")
  printf '%s\0' "${kubelet_cmd[@]}" > "$n/kubelet.cmd"
  setsid nsenter --mount="/proc/$(cat "$pidf-containerd.pid")/ns/mnt" -- "${kubelet_cmd[@]}" \
    > "$state/logs/$name-kubelet.log" 2>&1 < /dev/null 9>&- &
  echo $! > "$pidf-kubelet.pid"
}

start=$(date +%s.%N)
last=$((first + count - 1))
for i in $(seq "$first" "$last"); do start_node "$i"; done

# Ready: registered, Ready=True, and the node's CNI config was read (the kubelet says
# NetworkReady through the runtime before it reports Ready).
deadline=$(( $(date +%s) + 120 ))
for i in $(seq "$first" "$last"); do
  name="real-node-$i"
  until [ "$(kubectl get node "$name" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]; do
    if ! kill -0 "$(cat "$state/pids/$name-kubelet.pid")" 2>/dev/null || [ "$(date +%s)" -ge "$deadline" ]; then
      tail -n 30 "$state/logs/$name-kubelet.log" >&2
      fail "$name did not become Ready (log: $state/logs/$name-kubelet.log)"
    fi
    sleep 0.5
  done
done
elapsed=$(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $start}")
echo "$elapsed" > "$state/nodes-startup-seconds"
echo "nodes-up: $count real nodes (kubelet $("$node_bin/kubelet" --version | cut -d' ' -f2), containerd $("$node_bin/containerd" --version | cut -d' ' -f3)) Ready in ${elapsed}s on $node_ip" >&2
