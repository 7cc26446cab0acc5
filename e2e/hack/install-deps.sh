#!/usr/bin/env bash
# Installs what `make` needs on a fresh machine, from the package registries only. Idempotent:
# a machine that has everything returns in well under a second.
set -euo pipefail

need_apt=()
command -v openssl >/dev/null || need_apt+=(openssl)
command -v curl >/dev/null || need_apt+=(curl)
# make check-packaging: the Argo CD health check runs on a real Lua interpreter, the alert rules
# through promtool (Debian's prometheus package), the dashboard checks use jq.
command -v lua5.4 >/dev/null || need_apt+=(lua5.4)
command -v promtool >/dev/null || need_apt+=(prometheus)
command -v jq >/dev/null || need_apt+=(jq)
# Real e2e nodes (nodes-up.sh): runc and the CNI plugins beside the kubelet and containerd that
# build-node.sh builds; iptables for the pod network's fence; busybox-static and umoci for the
# images (build-images.sh).
command -v runc >/dev/null || need_apt+=(runc)
[ -x /usr/lib/cni/bridge ] || need_apt+=(containernetworking-plugins)
command -v iptables >/dev/null || need_apt+=(iptables)
dpkg -s busybox-static >/dev/null 2>&1 || need_apt+=(busybox-static)
command -v umoci >/dev/null || need_apt+=(umoci)
command -v unshare >/dev/null && command -v nsenter >/dev/null || need_apt+=(util-linux)
# make bench: the CLI's peak RSS (GNU time reports its child's own; see bench-scale.rs).
[ -x /usr/bin/time ] || need_apt+=(time)
if [ "${#need_apt[@]}" -gt 0 ]; then
  echo "install-deps: apt-get install ${need_apt[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

command -v go >/dev/null || { echo "install-deps: Go 1.26 is required to build the e2e control plane" >&2; exit 1; }
command -v cargo >/dev/null || { echo "install-deps: cargo is required" >&2; exit 1; }
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
  rustup component add rustfmt clippy
fi

# A cold `make test` writes about 14 GiB: the Rust target (6 GiB), Go's build and module caches
# (7 GiB, for the upstream control plane and nodes) and the e2e state. A full disk shows up later
# as a linker killed by SIGBUS or "No space left on device", so say it here, where it is clear.
avail_kib=$(df -Pk . | awk 'NR == 2 { print $4 }')
if [ -n "$avail_kib" ] && [ "$avail_kib" -lt $((16 * 1024 * 1024)) ]; then
  echo "install-deps: warning: $((avail_kib / 1024 / 1024)) GiB free on $(df -P . | awk 'NR == 2 { print $6 }');" \
    "a cold 'make test' needs about 14 GiB (warm caches need far less)" >&2
fi
