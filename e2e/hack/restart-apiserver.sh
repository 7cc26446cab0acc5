#!/usr/bin/env bash
# Restarts the shared cluster's kube-apiserver: stops it (SIGTERM, as a rolling control-plane
# upgrade does), keeps it down for DOWN seconds (default 10), then starts the command cluster-up.sh
# recorded in apiserver.cmd again. Returns once /readyz answers and prints that instant in Unix
# milliseconds. The API-server restart scenario of e2e/tests/e2e/migration/faults.rs runs it.
#
#   restart-apiserver.sh [DOWN]      SWITCHYARD_CLUSTER_STATE (default e2e/.cluster)
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
state=${SWITCHYARD_CLUSTER_STATE:-$here/.cluster}
down=${1:-10}
cmdfile="$state/apiserver.cmd"
pidfile="$state/pids/kube-apiserver.pid"
if [ ! -f "$cmdfile" ] || [ ! -f "$pidfile" ]; then
  echo "restart-apiserver: no API server recorded in $state; start the cluster with cluster-up.sh" >&2
  exit 1
fi
mapfile -d '' cmd < "$cmdfile"
kubectl="$(dirname "${cmd[0]}")/kubectl"

pid=$(cat "$pidfile")
if kill -TERM "$pid" 2>/dev/null; then
  # Long-running requests (watches) hold a graceful shutdown for up to a minute; 5 s is enough
  # for the server to stop taking new ones, and keeps the outage close to DOWN.
  for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
  if kill -0 "$pid" 2>/dev/null; then
    echo "restart-apiserver: kube-apiserver (pid $pid) still shutting down after 5s; killing it" >&2
    kill -KILL "$pid" 2>/dev/null || true
  fi
fi
sleep "$down"

setsid "${cmd[@]}" >>"$state/logs/kube-apiserver.log" 2>&1 < /dev/null &
echo $! > "$pidfile"
deadline=$(( $(date +%s) + 120 ))
until "$kubectl" --kubeconfig "$state/kubeconfig" get --raw /readyz >/dev/null 2>&1; do
  if [ "$(date +%s)" -ge "$deadline" ]; then
    echo "restart-apiserver: kube-apiserver did not become ready again; last log lines:" >&2
    tail -n 30 "$state/logs/kube-apiserver.log" >&2 || true
    exit 1
  fi
  sleep 0.2
done
date +%s%3N
