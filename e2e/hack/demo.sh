#!/usr/bin/env bash
# `make demo`: a live migration on a local control plane with simulated GPU nodes.
set -euo pipefail
echo "make demo: not available yet. It needs the migration engine (operator) and the driver agent;" >&2
echo "until they land, 'make cluster-up' and 'cargo run -p switchyard-e2e --bin gpu-node-sim -- --help'" >&2
echo "show the real control plane and the simulated GPU nodes." >&2
exit 2
