#!/usr/bin/env bash
# Starts a real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager
# and kube-scheduler, built from the upstream modules by build-controlplane.sh, and then
# SWITCHYARD_NODES (default 3) real worker nodes, each a kubelet with its own containerd
# (nodes-up.sh). The GPU node simulator (e2e/src/sim) adds simulated nodes for scale.
#
# State lives in e2e/.cluster (git-ignored): pki/, logs/, pids/, etcd data and the admin
# kubeconfig. When a healthy cluster from this directory is already running, it is reused.
#
#   SWITCHYARD_APISERVER_PORT  (default 16443)   SWITCHYARD_ETCD_PORT (default 12379)
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
state="$here/.cluster"
api_port=${SWITCHYARD_APISERVER_PORT:-16443}
etcd_port=${SWITCHYARD_ETCD_PORT:-12379}
etcd_peer_port=$((etcd_port + 1))
kcm_port=$((api_port + 1))
sched_port=$((api_port + 2))
kubeconfig="$state/kubeconfig"
api_bind=127.0.0.1
[ "${SWITCHYARD_NODES:-3}" -gt 0 ] && api_bind=0.0.0.0

mkdir -p "$state"
# Test binaries may call this concurrently; one starts the cluster, the others then reuse it.
exec 9>"$state/.lock"
flock 9

bin=$(bash "$here/hack/build-controlplane.sh")
kubectl() { "$bin/kubectl" --kubeconfig "$kubeconfig" "$@"; }

healthy() { [ -f "$kubeconfig" ] && kubectl get --raw /readyz >/dev/null 2>&1; }

if healthy; then
  echo "cluster-up: reusing the running control plane (KUBECONFIG=$kubeconfig)" >&2
  bash "$here/hack/nodes-up.sh" || { bash "$here/hack/cluster-down.sh" >&2 || true; exit 1; }
  exit 0
fi
# A half-started or crashed cluster: stop whatever is left of it before starting afresh.
bash "$here/hack/cluster-down.sh" >/dev/null 2>&1 || true

start=$(date +%s.%N)
mkdir -p "$state"/{pki,logs,pids}
rm -rf "$state/etcd"
# A previous control plane's audit files describe another cluster: the benches read every rotated
# file, and check that the oldest one starts before their window, which old files would satisfy.
rm -f "$state"/logs/audit*.log
pki="$state/pki"

# --- certificates -------------------------------------------------------------------------
# One CA signs everything: the serving cert and a client cert per component. The admin is in
# system:masters; the other components get the identities the default RBAC bootstrap expects.
if [ ! -f "$pki/ca.crt" ]; then
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=switchyard-e2e-ca" \
    -keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
  cat > "$pki/apiserver.ext" <<EOF
subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
extendedKeyUsage=serverAuth
EOF
  openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" -keyout "$pki/apiserver.key" \
    -out "$pki/apiserver.csr" 2>/dev/null
  openssl x509 -req -in "$pki/apiserver.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 3650 -extfile "$pki/apiserver.ext" -out "$pki/apiserver.crt" 2>/dev/null
  for id in "admin:/O=system:masters/CN=switchyard-admin" \
            "controller-manager:/CN=system:kube-controller-manager" \
            "scheduler:/CN=system:kube-scheduler"; do
    name=${id%%:*} subj=${id#*:}
    openssl req -newkey rsa:2048 -nodes -subj "$subj" -keyout "$pki/$name.key" -out "$pki/$name.csr" 2>/dev/null
    openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
      -days 3650 -extfile <(echo "extendedKeyUsage=clientAuth") -out "$pki/$name.crt" 2>/dev/null
  done
  openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
  openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
fi

# The aggregation layer's own CA and the API server's client cert for it, as kubeadm makes them:
# an aggregated API server (Kueue's visibility API) trusts requests that carry this client cert
# and the X-Remote-* headers, and refuses the API server's proxied calls (403) without them.
if [ ! -f "$pki/front-proxy-ca.crt" ]; then
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=switchyard-e2e-front-proxy-ca" \
    -keyout "$pki/front-proxy-ca.key" -out "$pki/front-proxy-ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=front-proxy-client" -keyout "$pki/front-proxy-client.key" \
    -out "$pki/front-proxy-client.csr" 2>/dev/null
  openssl x509 -req -in "$pki/front-proxy-client.csr" -CA "$pki/front-proxy-ca.crt" \
    -CAkey "$pki/front-proxy-ca.key" -CAcreateserial -days 3650 \
    -extfile <(echo "extendedKeyUsage=clientAuth") -out "$pki/front-proxy-client.crt" 2>/dev/null
fi

write_kubeconfig() { # name cert key
  cat > "$state/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: switchyard-e2e
  cluster:
    server: https://127.0.0.1:$api_port
    certificate-authority: $pki/ca.crt
users:
- name: $1
  user:
    client-certificate: $pki/$1.crt
    client-key: $pki/$1.key
contexts:
- name: switchyard-e2e
  context: {cluster: switchyard-e2e, user: $1}
current-context: switchyard-e2e
EOF
}
for c in admin controller-manager scheduler; do write_kubeconfig "$c"; done
cp "$state/admin.kubeconfig" "$kubeconfig"

# Metadata-level audit log of every request except the control plane's own, so benchmarks can
# count the API calls the operator (user agent switchyard-operator/...) makes per migrated node.
# Of the control plane's requests, only the pod writes of the DaemonSet and ReplicaSet controllers
# and the scheduler's bindings are kept: the scale bench counts them beside the operator's, since
# their client rate limits set a floor under a wide migration's time.
cat > "$state/audit-policy.yaml" <<EOF
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  users:
  - system:serviceaccount:kube-system:daemon-set-controller
  - system:serviceaccount:kube-system:replicaset-controller
  - system:kube-scheduler
  verbs: [create, delete]
  resources:
  - group: ""
    resources: [pods, pods/binding]
- level: None
  users: [system:kube-controller-manager, system:kube-scheduler, system:apiserver]
- level: None
  userGroups: [system:serviceaccounts:kube-system, system:nodes]
- level: Metadata
EOF

# --- processes ----------------------------------------------------------------------------
launch() { # name args...: detached from this shell, PID recorded for cluster-down
  local name=$1; shift
  # 9>&-: a daemon must not hold the lock of this script (fd 9) after it exits.
  setsid "$@" >"$state/logs/$name.log" 2>&1 < /dev/null 9>&- &
  echo $! > "$state/pids/$name.pid"
}

wait_for() { # what seconds command...
  local what=$1 deadline=$(( $(date +%s) + $2 )); shift 2
  until "$@" >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "cluster-up: $what did not become ready; last log lines:" >&2
      tail -n 30 "$state/logs/$what.log" >&2 || true
      # Leave nothing half-started behind: stop what this run launched.
      bash "$(dirname "$0")/cluster-down.sh" >&2 || true
      exit 1
    fi
    sleep 0.5
  done
}

# Another control plane (a different checkout, or one whose state directory was removed) may hold
# the ports; starting beside it fails half-way, so say so up front.
for port in "$etcd_port" "$etcd_peer_port" "$api_port" "$kcm_port" "$sched_port"; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "cluster-up: 127.0.0.1:$port is already in use (another control plane? stop it with" \
      "'make cluster-down' in its checkout, or set SWITCHYARD_APISERVER_PORT and SWITCHYARD_ETCD_PORT)" >&2
    exit 1
  fi
done

launch etcd "$bin/etcd" --name e2e --data-dir "$state/etcd" \
  --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
  --listen-peer-urls "http://127.0.0.1:$etcd_peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer_port" \
  --initial-cluster "e2e=http://127.0.0.1:$etcd_peer_port" --unsafe-no-fsync --quota-backend-bytes 4294967296
wait_for etcd 30 curl -sf "http://127.0.0.1:$etcd_port/health"

# --bind-address: loopback, and this machine's own address too when real nodes run, because their
# pods reach the API server there (nodes-up.sh sends the kubernetes Service's address to it).
# --kubelet-preferred-address-types: node names do not resolve here; `kubectl logs` and `exec` go
# to the node's InternalIP.
# --allow-privileged: as on every real cluster (kubeadm sets it), so privileged pod specs such as the
# driver agent's pass validation; without it the API server refuses them before Pod Security runs.
# --enable-aggregator-routing: the API server calls webhooks and aggregated APIs (Kueue's) at their
# Service's endpoint (a pod address on one of the nodes' bridges, routed on this machine) rather
# than its cluster IP, because nothing here implements cluster IPs for the API server (no
# kube-proxy). --requestheader-* and --proxy-client-*: the aggregation layer, as kubeadm sets it.
# --endpoint-reconciler-type=none: the loopback advertise address is valid for serving but may not
# be written into the kubernetes Service endpoints, and a machine without a default route has no
# other address to advertise.
apiserver=("$bin/kube-apiserver" \
  --etcd-servers "http://127.0.0.1:$etcd_port" \
  --bind-address "$api_bind" --secure-port "$api_port" --advertise-address 127.0.0.1 \
  --endpoint-reconciler-type none \
  --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
  --client-ca-file "$pki/ca.crt" \
  --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
  --service-account-issuer https://kubernetes.default.svc \
  --service-cluster-ip-range 10.96.0.0/16 \
  --authorization-mode Node,RBAC \
  --feature-gates CoordinatedLeaderElection=true --runtime-config coordination.k8s.io/v1beta1=true \
  --allow-privileged=true \
  --enable-aggregator-routing=true \
  --requestheader-client-ca-file "$pki/front-proxy-ca.crt" --requestheader-allowed-names front-proxy-client \
  --requestheader-username-headers X-Remote-User --requestheader-group-headers X-Remote-Group \
  --requestheader-extra-headers-prefix X-Remote-Extra- \
  --proxy-client-cert-file "$pki/front-proxy-client.crt" --proxy-client-key-file "$pki/front-proxy-client.key" \
  --kubelet-preferred-address-types InternalIP,Hostname \
  --audit-policy-file "$state/audit-policy.yaml" --audit-log-path "$state/logs/audit.log" \
  --audit-log-maxsize 200 --audit-log-maxbackup 10)
# restart-apiserver.sh starts the same command again (the API-server restart scenario).
printf '%s\0' "${apiserver[@]}" > "$state/apiserver.cmd"
launch kube-apiserver "${apiserver[@]}"
wait_for kube-apiserver 120 kubectl get --raw /readyz

# The controller manager's and the scheduler's client rate limits: upstream's defaults (20 and 50
# requests a second) unless SWITCHYARD_CONTROL_PLANE_QPS sets both (burst twice that). On the
# 2-core scale bench, raising them to 100 did not make a 1,000-node 10% migration faster (once
# slower): the 2 cores are the limit then. See docs/benchmarks.md, "Scale".
qps_flags=()
if [ -n "${SWITCHYARD_CONTROL_PLANE_QPS:-}" ]; then
  qps_flags=(--kube-api-qps "$SWITCHYARD_CONTROL_PLANE_QPS" --kube-api-burst "$((SWITCHYARD_CONTROL_PLANE_QPS * 2))")
fi
# What the scale bench holds the controllers' writes against: the controller manager's requests a
# second and burst, then the scheduler's (upstream's defaults: 20 and 30, 50 and 100).
q=${SWITCHYARD_CONTROL_PLANE_QPS:-}
echo "${q:-20} $(( ${q:-15} * 2 )) ${q:-50} $(( ${q:-50} * 2 ))" > "$state/control-plane-qps"
launch kube-controller-manager "$bin/kube-controller-manager" "${qps_flags[@]}" \
  --kubeconfig "$state/controller-manager.kubeconfig" \
  --authentication-kubeconfig "$state/controller-manager.kubeconfig" \
  --authorization-kubeconfig "$state/controller-manager.kubeconfig" \
  --bind-address 127.0.0.1 --secure-port "$kcm_port" \
  --root-ca-file "$pki/ca.crt" --service-account-private-key-file "$pki/sa.key" \
  --cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key" \
  --use-service-account-credentials --leader-elect=false \
  --service-cluster-ip-range 10.96.0.0/16
# The scheduler runs with coordinated leader election, as a control plane that turned it on does:
# it writes a LeaseCandidate in kube-system (its binary and emulation versions), from which the
# operator and `switchyard plan` read its version, and the API server's election controller
# names it the holder of its lease. The long lease outlasts the API server's restart in the
# restart scenario (a scheduler that cannot renew within the deadline exits). The controller
# manager stays without leader election: no pod or LeaseCandidate shows its version, the case of
# a managed control plane.
launch kube-scheduler "$bin/kube-scheduler" "${qps_flags[@]}" \
  --kubeconfig "$state/scheduler.kubeconfig" \
  --authentication-kubeconfig "$state/scheduler.kubeconfig" \
  --authorization-kubeconfig "$state/scheduler.kubeconfig" \
  --bind-address 127.0.0.1 --secure-port "$sched_port" \
  --feature-gates CoordinatedLeaderElection=true --leader-elect=true \
  --leader-elect-lease-duration 120s --leader-elect-renew-deadline 90s --leader-elect-retry-period 2s

wait_for kube-controller-manager 60 curl -skf "https://127.0.0.1:$kcm_port/healthz"
wait_for kube-scheduler 60 curl -skf "https://127.0.0.1:$sched_port/healthz"
# The default ServiceAccount appears once the controller manager's token controllers run; pods
# in the default namespace cannot be created before it.
wait_for kube-controller-manager 60 kubectl -n default get serviceaccount default
# The scheduler schedules once the API server's election controller names it the holder of its
# lease (after asking every candidate for 5 s).
scheduler_leads() { [ -n "$(kubectl -n kube-system get lease kube-scheduler -o jsonpath='{.spec.holderIdentity}')" ]; }
wait_for kube-scheduler 60 scheduler_leads

elapsed=$(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $start}")
echo "$elapsed" > "$state/startup-seconds"
# A node that cannot start stops the whole cluster: nothing is left running half-made.
bash "$here/hack/nodes-up.sh" || { bash "$here/hack/cluster-down.sh" >&2 || true; exit 1; }
echo "cluster-up: control plane $(kubectl version -o json | sed -n 's/.*"gitVersion": "\(v[^"]*\)".*/\1/p' | tail -n1) ready in ${elapsed}s" >&2
echo "cluster-up: export KUBECONFIG=$kubeconfig" >&2
