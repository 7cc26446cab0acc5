#!/usr/bin/env bash
# Builds the helm v3 CLI from the Go module proxy (helm.sh/helm/v3, cmd/helm) into a cache outside
# the repo and prints the path of the binary. A warm cache returns at once. Same cache layout as
# build-controlplane.sh: ${SWITCHYARD_CACHE_DIR:-~/.cache/switchyard}/tools/helm-<version>/helm.
#
#   SWITCHYARD_HELM_VERSION   helm release to build (default below)
#   SWITCHYARD_CACHE_DIR      cache root (default: ${XDG_CACHE_HOME:-~/.cache}/switchyard)
set -euo pipefail

# Pinned: the chart is linted and rendered by exactly this release. v3.22 builds against the
# v0.37 client libraries, so its default .Capabilities.KubeVersion is 1.37, like our cluster.
version=${SWITCHYARD_HELM_VERSION:-v3.22.0}
cache_root=${SWITCHYARD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/switchyard}
dest="$cache_root/tools/helm-$version"

if [ -x "$dest/helm" ] && [ -f "$dest/.complete" ]; then
  echo "$dest/helm"
  exit 0
fi

command -v go >/dev/null || { echo "build-helm: Go is required to build helm from the module proxy" >&2; exit 1; }
echo "build-helm: building helm $version into $dest (cold: a few minutes on 2 cores)" >&2
start=$(date +%s)
work="$dest.tmp.$$"
rm -rf "$work"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT

# helm's own Makefile stamps the version and the Kubernetes minor of its client-go into the
# binary; without them `helm version` says "v3" and templates see KubeVersion v1.20.
gomod=$(GOFLAGS=-mod=mod go mod download -json "helm.sh/helm/v3@$version" | sed -n 's/^\s*"GoMod": "\(.*\)",$/\1/p')
[ -f "$gomod" ] || { echo "build-helm: could not fetch helm.sh/helm/v3@$version" >&2; exit 1; }
client_go=$(sed -n 's/^\s*k8s.io\/client-go v0\.\([0-9]*\)\..*/\1/p' "$gomod" | head -n1)
[ -n "$client_go" ] || { echo "build-helm: no k8s.io/client-go in $gomod" >&2; exit 1; }
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$version -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$client_go"
done

# `go install pkg@version` builds with helm's own go.mod and go.sum, checked against sum.golang.org.
CGO_ENABLED=0 GOBIN="$work" go install -trimpath -ldflags "$ldflags" "helm.sh/helm/v3/cmd/helm@$version"
"$work/helm" version --short >/dev/null
touch "$work/.complete"
rm -rf "$dest"
mkdir -p "$(dirname "$dest")"
mv "$work" "$dest"
trap - EXIT
echo "build-helm: $("$dest/helm" version --short) ready in $(( $(date +%s) - start ))s" >&2
echo "$dest/helm"
