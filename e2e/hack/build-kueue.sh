#!/usr/bin/env bash
# Builds Kueue's manager (cmd/kueue of sigs.k8s.io/kueue, the version e2e/kueue/go.mod pins) from
# the Go module proxy into a cache outside the repo, keyed by that module and the Go version, and
# prints the binary's path. A warm cache returns at once. Static (CGO_ENABLED=0), as Kueue's own
# image builds it.
#
#   SWITCHYARD_CACHE_DIR   cache root (default: ${XDG_CACHE_HOME:-~/.cache}/switchyard)
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
mod="$here/kueue"
version=$(cd "$mod" && go list -m -f '{{.Version}}' sigs.k8s.io/kueue)
key=$(cat "$mod"/go.{mod,sum} "$0" <(go env GOVERSION GOOS GOARCH) | sha256sum | cut -c1-12)
cache_root=${SWITCHYARD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/switchyard}
dest="$cache_root/kueue/kueue-$version-$key"

if [ -f "$dest/.complete" ]; then
  echo "$dest/bin/kueue"
  exit 0
fi

echo "build-kueue: building Kueue $version into $dest (cold: a few minutes on 2 cores)" >&2
mkdir -p "$dest/bin"
start=$(date +%s)
(cd "$mod" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$dest/bin/kueue.tmp.$$" sigs.k8s.io/kueue/cmd/kueue)
mv "$dest/bin/kueue.tmp.$$" "$dest/bin/kueue"
touch "$dest/.complete"
echo "build-kueue: ready in $(( $(date +%s) - start ))s" >&2
echo "$dest/bin/kueue"
