#!/usr/bin/env bash
# Reproducible images: builds every image a second time into a scratch directory and compares the
# manifest digests with target/images/digests.txt from the build just before. The Rust and Go
# binaries come from their build caches, so this repeats the packing, not the compiles.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
first="${SWITCHYARD_IMAGE_DIR:-$root/target/images}/digests.txt"
[ -f "$first" ] || { echo "check-images: $first is missing: run 'make images' first" >&2; exit 1; }
again=$(mktemp -d "${TMPDIR:-/tmp}/switchyard-images-again.XXXXXX")
trap 'rm -rf "$again"' EXIT
SWITCHYARD_IMAGE_DIR="$again" bash "$root/e2e/hack/build-images.sh" 2>/dev/null
if ! diff -u "$first" "$again/digests.txt" >&2; then
  echo "check-images: the same checkout built images with different digests (above)" >&2
  exit 1
fi
echo "check-images: $(wc -l < "$first") images, the same digests twice" >&2
