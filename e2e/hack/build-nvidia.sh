#!/usr/bin/env bash
# Builds one command of NVIDIA's k8s-device-plugin module (the version e2e/nvidia/go.mod pins) or
# of NVIDIA's DRA driver for GPUs (e2e/nvidia-dra/go.mod) from the Go module proxy into a cache
# outside the repo, keyed by that module and the Go version, and prints the binary's path. A warm
# cache returns at once.
#
#   e2e/hack/build-nvidia.sh gpu-feature-discovery | nvidia-device-plugin
#   e2e/hack/build-nvidia.sh gpu-kubelet-plugin | nvidia-cdi-hook
#
# nvidia-cdi-hook is nvidia-container-toolkit's, at the version NVIDIA's DRA driver requires: the
# DRA driver's image carries it and its kubelet plugin copies it to the host for its CDI specs.
#   SWITCHYARD_CACHE_DIR   cache root (default: ${XDG_CACHE_HOME:-~/.cache}/switchyard)
set -euo pipefail

cmd=${1:?usage: build-nvidia.sh gpu-feature-discovery|nvidia-device-plugin|gpu-kubelet-plugin|nvidia-cdi-hook}
here=$(cd "$(dirname "$0")/.." && pwd)
case "$cmd" in
  gpu-feature-discovery | nvidia-device-plugin)
    mod="$here/nvidia" module=github.com/NVIDIA/k8s-device-plugin name=k8s-device-plugin ;;
  gpu-kubelet-plugin)
    mod="$here/nvidia-dra" module=sigs.k8s.io/dra-driver-nvidia-gpu name=dra-driver-nvidia-gpu ;;
  nvidia-cdi-hook)
    mod="$here/nvidia-dra" module=github.com/NVIDIA/nvidia-container-toolkit name=nvidia-container-toolkit ;;
  *) echo "build-nvidia: unknown command $cmd" >&2; exit 2 ;;
esac
version=$(cd "$mod" && go list -m -f '{{.Version}}' "$module")
[ -n "$version" ] || { echo "build-nvidia: no $module version in ${mod#"$here/"}/go.mod" >&2; exit 1; }

key=$(cat "$mod"/go.{mod,sum} "$0" <(find "$mod" -name '*.go' -path '*unserved*' -print0 | sort -z | xargs -0 -r cat) \
  <(go env GOVERSION GOOS GOARCH) | sha256sum | cut -c1-12)
cache_root=${SWITCHYARD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/switchyard}
dest="$cache_root/nvidia/$name-$version-$key"

if [ -f "$dest/.complete-$cmd" ]; then
  echo "$dest/bin/$cmd"
  exit 0
fi

echo "build-nvidia: building $cmd of $name $version into $dest (cold: about 3 minutes on 2 cores)" >&2
mkdir -p "$dest/bin"
start=$(date +%s)
# cgo: go-nvml loads libnvidia-ml.so.1 with dlopen, as on a GPU node.
(cd "$mod" && go build -trimpath -ldflags "-s -w" -o "$dest/bin/$cmd.tmp.$$" \
  "$module/cmd/$cmd")
mv "$dest/bin/$cmd.tmp.$$" "$dest/bin/$cmd"
touch "$dest/.complete-$cmd"
echo "build-nvidia: ready in $(( $(date +%s) - start ))s" >&2
echo "$dest/bin/$cmd"
