#!/usr/bin/env bash
# Builds the NVML mock and loads it through NVIDIA's own Go bindings (go-nvml, as NVIDIA's device
# plugin, GPU Feature Discovery and DRA driver load libnvidia-ml.so.1), comparing what they read
# with the mock's inventory and checking that every NVML function is exported; then runs NVIDIA's
# GPU Feature Discovery (k8s-device-plugin v0.19.3, built from its module) against the mock and
# compares its labels with operator/tests/fixtures/gfd/. `make unit` runs it.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cargo build --quiet -p switchyard-nvml-mock --manifest-path "$root/Cargo.toml"
lib="${CARGO_TARGET_DIR:-$root/target}/debug/libnvidia_ml_mock.so"
[ -f "$lib" ] || { echo "nvml-mock-check: $lib was not built" >&2; exit 1; }
# NVIDIA's GPU Feature Discovery, built from its module (cached), labels the mock's GPUs.
gfd=$(bash "$root/e2e/hack/build-vendor.sh" gpu-feature-discovery)
cd "$root/e2e/nvml-mock/gocheck"
# NVML 13 marks some functions deprecated; cgo compiles a call to each, so its warnings are noise.
CGO_CFLAGS="${CGO_CFLAGS:--O2 -g} -Wno-deprecated-declarations" NVML_MOCK_LIBRARY="$lib" GFD_BIN="$gfd" \
  go test -count=1 -v ./... | grep -E "^(=== RUN|--- |ok|FAIL|PASS)|_test.go"
