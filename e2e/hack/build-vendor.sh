#!/usr/bin/env bash
# Builds one command of a vendor component the e2e world runs, from the Go module proxy at the
# version its e2e module pins, into a cache outside the repo keyed by that module and the Go
# version, and prints the binary's path. A warm cache returns at once.
#
#   e2e/hack/build-vendor.sh nvidia-device-plugin | gpu-feature-discovery | config-manager
#       NVIDIA's k8s-device-plugin (e2e/nvidia/go.mod)
#   e2e/hack/build-vendor.sh gpu-kubelet-plugin | nvidia-cdi-hook
#       NVIDIA's DRA driver for GPUs, and nvidia-container-toolkit's hook at the version that driver
#       requires: the driver's image carries it and its kubelet plugin copies it to the host for its
#       CDI specs (e2e/nvidia-dra/go.mod)
#   e2e/hack/build-vendor.sh nfd-master
#       Node Feature Discovery's master, which labels the nodes with what GPU Feature Discovery
#       publishes, as in a GPU Operator install (e2e/nfd/go.mod)
#   e2e/hack/build-vendor.sh kueue
#       Kueue's manager, static as Kueue's own image builds it (e2e/kueue/go.mod)
#
#   SWITCHYARD_CACHE_DIR   cache root (default: ${XDG_CACHE_HOME:-~/.cache}/switchyard)
set -euo pipefail

cmd=${1:?usage: build-vendor.sh nvidia-device-plugin|gpu-feature-discovery|config-manager|gpu-kubelet-plugin|nvidia-cdi-hook|nfd-master|kueue}
here=$(cd "$(dirname "$0")/.." && pwd)
# cgo by default: go-nvml loads libnvidia-ml.so.1 with dlopen, as on a GPU node.
cgo=1
case "$cmd" in
  gpu-feature-discovery | nvidia-device-plugin | config-manager)
    mod="$here/nvidia" module=github.com/NVIDIA/k8s-device-plugin name=k8s-device-plugin ;;
  gpu-kubelet-plugin)
    mod="$here/nvidia-dra" module=sigs.k8s.io/dra-driver-nvidia-gpu name=dra-driver-nvidia-gpu ;;
  nvidia-cdi-hook)
    mod="$here/nvidia-dra" module=github.com/NVIDIA/nvidia-container-toolkit name=nvidia-container-toolkit ;;
  nfd-master)
    mod="$here/nfd" module=sigs.k8s.io/node-feature-discovery name=node-feature-discovery ;;
  kueue)
    mod="$here/kueue" module=sigs.k8s.io/kueue name=kueue cgo=0 ;;
  *) echo "build-vendor: unknown command $cmd" >&2; exit 2 ;;
esac
version=$(cd "$mod" && go list -m -f '{{.Version}}' "$module")
[ -n "$version" ] || { echo "build-vendor: no $module version in ${mod#"$here/"}/go.mod" >&2; exit 1; }

key=$(cat "$mod"/go.{mod,sum} "$0" <(find "$mod" -name '*.go' -path '*unserved*' -print0 | sort -z | xargs -0 -r cat) \
  <(go env GOVERSION GOOS GOARCH) | sha256sum | cut -c1-12)
cache_root=${SWITCHYARD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/switchyard}
dest="$cache_root/vendor/$name-$version-$key"

if [ -f "$dest/.complete-$cmd" ]; then
  echo "$dest/bin/$cmd"
  exit 0
fi

echo "build-vendor: building $cmd of $name $version into $dest (cold: about 3 minutes on 2 cores)" >&2
mkdir -p "$dest/bin"
start=$(date +%s)
(cd "$mod" && CGO_ENABLED=$cgo go build -trimpath -ldflags "-s -w" -o "$dest/bin/$cmd.tmp.$$" \
  "$module/cmd/$cmd")
mv "$dest/bin/$cmd.tmp.$$" "$dest/bin/$cmd"
touch "$dest/.complete-$cmd"
echo "build-vendor: ready in $(( $(date +%s) - start ))s" >&2
echo "$dest/bin/$cmd"
