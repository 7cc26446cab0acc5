#!/usr/bin/env bash
# Builds the NVML mock (e2e/nvml-mock, libnvidia-ml.so.1 for machines without a GPU) in the
# "image" profile, its build paths remapped as the images' binaries are, and prints the library's
# path; the driver root's nvidia-smi (its NVML client, src/bin/nvidia-smi.rs) lies beside it.
# nodes-up.sh lays both out in each real node's driver root.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
flags="--remap-path-prefix=$root=/src --remap-path-prefix=${CARGO_HOME:-$HOME/.cargo}=/cargo"
CARGO_ENCODED_RUSTFLAGS=$(printf '%s' "$flags" | tr ' ' '\037') \
  cargo build --quiet --locked --profile image -p switchyard-nvml-mock --manifest-path "$root/Cargo.toml" >&2
lib="${CARGO_TARGET_DIR:-$root/target}/image/libnvidia_ml_mock.so"
[ -f "$lib" ] || { echo "build-nvml-mock: $lib was not built" >&2; exit 1; }
[ -f "$(dirname "$lib")/nvidia-smi" ] || { echo "build-nvml-mock: nvidia-smi was not built beside $lib" >&2; exit 1; }
echo "$lib"
