#!/usr/bin/env bash
# Builds what a real e2e node runs besides runc and the CNI plugins (Debian's): the kubelet, from
# the same upstream Kubernetes release as the control plane, and containerd, ctr and the runc shim
# from the module proxy. Cached outside the repo like the control plane, keyed by both versions
# and by the hash of the wrapper modules; a warm cache returns at once. Prints the bin directory.
#
#   SWITCHYARD_CACHE_DIR   cache root (default: ${XDG_CACHE_HOME:-~/.cache}/switchyard)
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
k8s_version=$(sed -n 's/^\s*k8s.io\/kubernetes \(v[0-9.]*\).*/\1/p' "$here/kubelet/go.mod" | head -n1)
cp_version=$(sed -n 's/^\s*k8s.io\/kubernetes \(v[0-9.]*\).*/\1/p' "$here/controlplane/go.mod" | head -n1)
ctrd_version=$(sed -n 's/^\s*github.com\/containerd\/containerd\/v2 \(v[0-9.]*\).*/\1/p' "$here/containerd/go.mod" | head -n1)
[ -n "$k8s_version" ] && [ -n "$ctrd_version" ] || { echo "build-node: no versions in e2e/kubelet or e2e/containerd go.mod" >&2; exit 1; }
[ "$k8s_version" = "$cp_version" ] || {
  echo "build-node: e2e/kubelet is at $k8s_version but the control plane at $cp_version; regenerate it with" \
    "'e2e/hack/gen-controlplane-gomod.sh $cp_version e2e/kubelet'" >&2
  exit 1
}

key=$(cat "$here"/kubelet/go.{mod,sum} "$here"/containerd/go.{mod,sum} "$0" \
  <(go env GOVERSION GOOS GOARCH) | sha256sum | cut -c1-12)
cache_root=${SWITCHYARD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/switchyard}
dest="$cache_root/node/kubelet-$k8s_version-containerd-$ctrd_version-$key"

if [ -f "$dest/.complete" ]; then
  echo "$dest/bin"
  exit 0
fi

echo "build-node: building kubelet $k8s_version and containerd $ctrd_version into $dest (cold: about 10 min on 2 cores, 4 min after the control plane)" >&2
work="$dest.tmp.$$"
rm -rf "$work"
mkdir -p "$work/bin"
trap 'rm -rf "$work"' EXIT
start=$(date +%s)
export CGO_ENABLED=0

# The kubelet reports its version from the same ldflags upstream's hack/lib/version.sh sets, as
# the control-plane build does.
minor=${k8s_version#v1.}; minor=${minor%%.*}
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done
(cd "$here/kubelet" && go build -trimpath -ldflags "$ldflags" -o "$work/bin/kubelet" k8s.io/kubernetes/cmd/kubelet)
echo "build-node: kubelet done after $(( $(date +%s) - start ))s" >&2

# no_btrfs: the btrfs snapshotter needs cgo and libbtrfs; the nodes use overlayfs.
ldflags="-s -w -X github.com/containerd/containerd/v2/version.Version=$ctrd_version"
ldflags+=" -X github.com/containerd/containerd/v2/version.Package=github.com/containerd/containerd/v2"
for cmd in containerd ctr containerd-shim-runc-v2; do
  (cd "$here/containerd" && go build -trimpath -tags no_btrfs -ldflags "$ldflags" -o "$work/bin/$cmd" \
    "github.com/containerd/containerd/v2/cmd/$cmd")
done
echo "build-node: containerd done after $(( $(date +%s) - start ))s" >&2

echo "$(( $(date +%s) - start ))" > "$work/build-seconds"
touch "$work/.complete"
rm -rf "$dest"
mv "$work" "$dest"
trap - EXIT
echo "build-node: cache ready in $(( $(date +%s) - start ))s ($(du -sh "$dest" | cut -f1))" >&2
echo "$dest/bin"
