#!/usr/bin/env bash
# Stops the real nodes that nodes-up.sh started and undoes the host changes it recorded in
# $state/nodes/host-changes: sysctls back to their values, the iptables chains and the bridges
# removed, the per-node cgroups and the mount points it created removed. Called by cluster-down.sh.
#
# Per node: the kubelet first (so that it restarts nothing), then every process in the node's
# cgroups (the containers), the runc shims of its containerd, and containerd. With the last of
# them gone, the node's mount namespace and every mount in it (container root filesystems,
# network-namespace files) go too.
set -euo pipefail

state="${SWITCHYARD_CLUSTER_STATE:-$(cd "$(dirname "$0")/.." && pwd)/.cluster}"
nodes_dir="$state/nodes"
changes="$nodes_dir/host-changes"

stop_pid() { # pidfile expected-binary
  local pidfile=$1 want=$2 pid exe
  [ -f "$pidfile" ] || return 0
  pid=$(cat "$pidfile")
  exe=$(readlink "/proc/$pid/exe" 2>/dev/null || true)
  # nsenter and unshare exec the binary; a recycled PID that runs something else is left alone.
  case "$(basename "$exe")" in
    "$want"|bash|unshare|nsenter)
      kill -TERM "$pid" 2>/dev/null || true
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -KILL "$pid" 2>/dev/null || true
      echo "nodes-down: stopped $(basename "$pidfile" .pid) ($pid)" >&2 ;;
  esac
  rm -f "$pidfile"
}

kill_cgroup() { # cgroup path under each hierarchy
  local procs
  for procs in $(find /sys/fs/cgroup/pids"$1" -name cgroup.procs 2>/dev/null); do
    xargs -r kill -KILL < "$procs" 2>/dev/null || true
  done
}

for n in "$nodes_dir"/node*; do
  [ -d "$n" ] || continue
  i=${n##*/node}
  name="real-node-$i"
  stop_pid "$state/pids/$name-kubelet.pid" kubelet
  kill_cgroup "/switchyard-node$i"
  pkill -KILL -f -- "-address $n/run/containerd.sock" 2>/dev/null || true
  stop_pid "$state/pids/$name-containerd.pid" containerd
done

[ -f "$changes" ] || exit 0
# Cgroups can be removed once their last process has exited; give the kernel a moment.
sleep 0.5
tac "$changes" | while read -r kind a b; do
  case "$kind" in
    sysctl) sysctl -q -w "$a=$b" >/dev/null 2>&1 || echo "nodes-down: could not restore $a=$b" >&2 ;;
    dir) rmdir "$a" 2>/dev/null || echo "nodes-down: left $a in place (not empty)" >&2 ;;
    link) ip link del "$a" 2>/dev/null || true ;;
    cgroup)
      for h in /sys/fs/cgroup/*; do
        [ -d "$h$a" ] && find "$h$a" -depth -type d -exec rmdir {} + 2>/dev/null
        [ -d "$h$a" ] && echo "nodes-down: could not remove cgroup $h$a" >&2
      done ;;
    iptables)
      case "$a" in
        filter)
          iptables -w -D FORWARD -s 10.88.0.0/16 -j "$b" 2>/dev/null || true
          iptables -w -F "$b" 2>/dev/null || true; iptables -w -X "$b" 2>/dev/null || true ;;
        nat)
          iptables -w -t nat -D PREROUTING -s 10.88.0.0/16 -j "$b" 2>/dev/null || true
          iptables -w -t nat -F "$b" 2>/dev/null || true; iptables -w -t nat -X "$b" 2>/dev/null || true ;;
        kubelet-chains)
          # The kubelet's jump to KUBE-FIREWALL from INPUT and OUTPUT first, then the chains.
          for chain in INPUT OUTPUT; do
            while iptables -w -D "$chain" -j KUBE-FIREWALL 2>/dev/null; do :; done
          done
          for cmd in iptables ip6tables; do
            command -v "$cmd" >/dev/null || continue
            for table in mangle nat filter; do
              for chain in KUBE-KUBELET-CANARY KUBE-FIREWALL KUBE-IPTABLES-HINT KUBE-MARK-DROP; do
                "$cmd" -w -t "$table" -F "$chain" 2>/dev/null || true
                "$cmd" -w -t "$table" -X "$chain" 2>/dev/null || true
              done
            done
          done ;;
      esac ;;
  esac
done
rm -f "$changes"
echo "nodes-down: host changes undone" >&2
