#!/usr/bin/env bash
# Builds etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kubectl from the
# module proxy into a cache outside the repo, keyed by Kubernetes version and by the hash of the
# wrapper modules, and prints the cache's bin directory. A warm cache returns at once.
#
#   SWITCHYARD_CACHE_DIR   cache root (default: ${XDG_CACHE_HOME:-~/.cache}/switchyard)
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
k8s_version=$(sed -n 's/^\s*k8s.io\/kubernetes \(v[0-9.]*\).*/\1/p' "$here/controlplane/go.mod" | head -n1)
[ -n "$k8s_version" ] || { echo "build-controlplane: no k8s.io/kubernetes version in controlplane/go.mod" >&2; exit 1; }

key=$(cat "$here"/controlplane/go.{mod,sum} "$here"/etcd/go.{mod,sum} "$here"/etcd/main.go "$0" \
  <(go env GOVERSION GOOS GOARCH) | sha256sum | cut -c1-12)
cache_root=${SWITCHYARD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/switchyard}
dest="$cache_root/controlplane/$k8s_version-$key"

if [ -f "$dest/.complete" ]; then
  echo "$dest/bin"
  exit 0
fi

echo "build-controlplane: building Kubernetes $k8s_version and etcd into $dest (cold: 20-40 min on 2 cores)" >&2
work="$dest.tmp.$$"
rm -rf "$work"
mkdir -p "$work/bin"
trap 'rm -rf "$work"' EXIT
start=$(date +%s)

# The version the servers report comes from ldflags, as upstream's hack/lib/version.sh sets them.
minor=${k8s_version#v1.}; minor=${minor%%.*}
build_date=$(cd "$here/controlplane" && go mod download -json "k8s.io/kubernetes@$k8s_version" \
  | sed -n 's/^\s*"Time": "\(.*\)",\?$/\1/p' | head -n1)
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$build_date"
done

export CGO_ENABLED=0
(cd "$here/etcd" && go build -trimpath -ldflags "-s -w" -o "$work/bin/etcd" .)
for cmd in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
  (cd "$here/controlplane" && go build -trimpath -ldflags "$ldflags" -o "$work/bin/$cmd" "k8s.io/kubernetes/cmd/$cmd")
  echo "build-controlplane: $cmd done after $(( $(date +%s) - start ))s" >&2
done

echo "$(( $(date +%s) - start ))" > "$work/build-seconds"
touch "$work/.complete"
rm -rf "$dest"
mv "$work" "$dest"
trap - EXIT
echo "build-controlplane: cache ready in $(( $(date +%s) - start ))s ($(du -sh "$dest" | cut -f1))" >&2
echo "$dest/bin"
