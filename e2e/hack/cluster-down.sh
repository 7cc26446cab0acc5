#!/usr/bin/env bash
# Stops exactly the processes cluster-up.sh started, by their recorded PIDs, and only when the PID
# still belongs to the binary we launched (a recycled PID is left alone): the real nodes first
# (nodes-down.sh, which also undoes their host changes), then the control plane. Keeps pki/ and
# logs/.
set -euo pipefail

state="$(cd "$(dirname "$0")/.." && pwd)/.cluster"
bash "$(dirname "$0")/nodes-down.sh"
[ -d "$state/pids" ] || { echo "cluster-down: nothing recorded in $state/pids" >&2; exit 0; }

# Reverse start order: clients of the API server first, etcd last.
for name in kube-scheduler kube-controller-manager kube-apiserver etcd; do
  pidfile="$state/pids/$name.pid"
  [ -f "$pidfile" ] || continue
  pid=$(cat "$pidfile")
  exe=$(readlink "/proc/$pid/exe" 2>/dev/null || true)
  if [ "$(basename "$exe")" = "$name" ]; then
    kill -TERM "$pid"
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
    echo "cluster-down: stopped $name ($pid)" >&2
  fi
  rm -f "$pidfile"
done
rm -f "$state/kubeconfig"
