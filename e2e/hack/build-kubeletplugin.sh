#!/usr/bin/env bash
# Builds the kubelet-plugin harness (e2e/kubeletplugin: the kubelet's plugin manager and DRA
# manager as a client of our driver agent) into a cache outside the repo, keyed by Kubernetes
# version and by the hash of the module, and prints the binary's path. A warm cache returns at once.
#
#   SWITCHYARD_CACHE_DIR   cache root (default: ${XDG_CACHE_HOME:-~/.cache}/switchyard)
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
mod="$here/kubeletplugin"
k8s_version=$(sed -n 's/^\s*k8s.io\/kubernetes \(v[0-9.]*\).*/\1/p' "$mod/go.mod" | head -n1)
[ -n "$k8s_version" ] || { echo "build-kubeletplugin: no k8s.io/kubernetes version in kubeletplugin/go.mod" >&2; exit 1; }

key=$(cat "$mod"/go.{mod,sum} "$mod"/*.go "$0" <(go env GOVERSION GOOS GOARCH) | sha256sum | cut -c1-12)
cache_root=${SWITCHYARD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/switchyard}
dest="$cache_root/kubeletplugin/$k8s_version-$key"

if [ -f "$dest/.complete" ]; then
  echo "$dest/bin/kubeletplugin"
  exit 0
fi

echo "build-kubeletplugin: building the harness against Kubernetes $k8s_version into $dest (cold: a few minutes on 2 cores)" >&2
work="$dest.tmp.$$"
rm -rf "$work"
mkdir -p "$work/bin"
trap 'rm -rf "$work"' EXIT
start=$(date +%s)
(cd "$mod" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$work/bin/kubeletplugin" .)
touch "$work/.complete"
rm -rf "$dest"
mv "$work" "$dest"
trap - EXIT
echo "build-kubeletplugin: ready in $(( $(date +%s) - start ))s" >&2
echo "$dest/bin/kubeletplugin"
