#!/usr/bin/env bash
# Prints the directory that holds the Prometheus Operator's CRDs (monitoring.coreos.com), as its
# own repository ships them (example/prometheus-operator-crd/), from its Go module at the version
# pinned here. The manifests e2e applies the ServiceMonitor and PrometheusRule CRDs from it for
# real, so the dry-runs of config/components/monitoring and the chart's monitoring toggles run
# against the real schemas. Downloaded once into Go's module cache; a warm cache returns at once.
#
# The module's checksum is pinned too, and the download is checked against it: the Go checksum
# database already verifies it, this says which content the e2e was written against.
set -euo pipefail

module=github.com/prometheus-operator/prometheus-operator
# The newest version the module proxy served on 2026-12-07 (v0.87 and later are refused there).
version=v0.86.1
sum='h1:pHUuiRErcFb3nFDox7RxoxpEN0FyT24GtYOkr2GBu04='

# Outside any module: `go mod download` then fetches exactly module@version.
json=$(cd / && GOFLAGS=-mod=mod go mod download -json "$module@$version")
field() { printf '%s\n' "$json" | sed -n "s/^[[:space:]]*\"$1\": \"\(.*\)\",\{0,1\}$/\1/p" | head -1; }
err=$(field Error)
[ -z "$err" ] || { echo "prometheus-crds: $err" >&2; exit 1; }
got=$(field Sum)
[ "$got" = "$sum" ] || { echo "prometheus-crds: $module@$version has sum $got, expected $sum" >&2; exit 1; }
dir="$(field Dir)/example/prometheus-operator-crd"
for crd in servicemonitors prometheusrules; do
  [ -f "$dir/monitoring.coreos.com_$crd.yaml" ] || { echo "prometheus-crds: no $crd CRD in $dir" >&2; exit 1; }
done
echo "$dir"
