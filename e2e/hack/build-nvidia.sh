#!/usr/bin/env bash
# Builds one command of NVIDIA's k8s-device-plugin module (the version e2e/nvidia/go.mod pins)
# from the Go module proxy into a cache outside the repo, keyed by that module and the Go version,
# and prints the binary's path. A warm cache returns at once.
#
#   e2e/hack/build-nvidia.sh gpu-feature-discovery | nvidia-device-plugin
#   SWITCHYARD_CACHE_DIR   cache root (default: ${XDG_CACHE_HOME:-~/.cache}/switchyard)
set -euo pipefail

cmd=${1:?usage: build-nvidia.sh gpu-feature-discovery|nvidia-device-plugin}
case "$cmd" in
  gpu-feature-discovery | nvidia-device-plugin) ;;
  *) echo "build-nvidia: unknown command $cmd" >&2; exit 2 ;;
esac
here=$(cd "$(dirname "$0")/.." && pwd)
mod="$here/nvidia"
version=$(sed -n 's/^require github.com\/NVIDIA\/k8s-device-plugin \(v[0-9.]*\)$/\1/p' "$mod/go.mod")
[ -n "$version" ] || { echo "build-nvidia: no k8s-device-plugin version in e2e/nvidia/go.mod" >&2; exit 1; }

key=$(cat "$mod"/go.{mod,sum} "$0" <(go env GOVERSION GOOS GOARCH) | sha256sum | cut -c1-12)
cache_root=${SWITCHYARD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/switchyard}
dest="$cache_root/nvidia/k8s-device-plugin-$version-$key"

if [ -f "$dest/.complete-$cmd" ]; then
  echo "$dest/bin/$cmd"
  exit 0
fi

echo "build-nvidia: building $cmd of k8s-device-plugin $version into $dest (cold: about 3 minutes on 2 cores)" >&2
mkdir -p "$dest/bin"
start=$(date +%s)
# cgo: go-nvml loads libnvidia-ml.so.1 with dlopen, as on a GPU node.
(cd "$mod" && go build -trimpath -ldflags "-s -w" -o "$dest/bin/$cmd.tmp.$$" \
  "github.com/NVIDIA/k8s-device-plugin/cmd/$cmd")
mv "$dest/bin/$cmd.tmp.$$" "$dest/bin/$cmd"
touch "$dest/.complete-$cmd"
echo "build-nvidia: ready in $(( $(date +%s) - start ))s" >&2
echo "$dest/bin/$cmd"
