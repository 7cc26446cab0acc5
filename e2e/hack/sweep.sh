#!/usr/bin/env bash
# Removes what crashed or interrupted e2e runs left on a reused cluster: simulated nodes,
# GpuPoolMigrations of e2e pools (finalizers dropped: their operator is gone), e2e namespaces and
# DeviceClasses, and DeviceTaintRules. Only objects older than SWEEP_MINUTES (default 15) go, so a
# run in progress elsewhere on the same cluster keeps its objects.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
kubectl=("$(bash "$root/e2e/hack/build-controlplane.sh")/kubectl" --kubeconfig "${SWITCHYARD_E2E_KUBECONFIG:-$root/e2e/.cluster/kubeconfig}")
cutoff=$(( $(date +%s) - ${SWEEP_MINUTES:-15} * 60 ))

old() { # kind [selector]: names of objects created before the cutoff
  "${kubectl[@]}" get "$1" ${2:+-l "$2"} -o jsonpath='{range .items[*]}{.metadata.name} {.metadata.creationTimestamp}{"\n"}{end}' \
    | while read -r name created; do
        [ -n "$name" ] && [ "$(date -d "$created" +%s)" -lt "$cutoff" ] && echo "$name"
      done || true
}

swept=0
for gpm in $(old gpupoolmigrations e2e.switchyard.dev/pool); do
  "${kubectl[@]}" patch gpupoolmigration "$gpm" --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null
  "${kubectl[@]}" delete gpupoolmigration "$gpm" --wait=false >/dev/null; swept=$((swept + 1))
done
for node in $(old nodes sim.switchyard.dev/instance); do
  "${kubectl[@]}" delete node "$node" --wait=false >/dev/null; swept=$((swept + 1))
done
for ns in $(old namespaces e2e.switchyard.dev/scenario); do
  "${kubectl[@]}" delete namespace "$ns" --wait=false >/dev/null; swept=$((swept + 1))
done
for kind in deviceclasses devicetaintrules; do
  for obj in $(old "$kind" e2e.switchyard.dev/scenario) $(old "$kind" switchyard.dev/managed-by=switchyard-operator); do
    "${kubectl[@]}" delete "$kind" "$obj" --wait=false >/dev/null; swept=$((swept + 1))
  done
done
[ "$swept" = 0 ] || echo "sweep: removed $swept stale object(s) left by earlier e2e runs" >&2
