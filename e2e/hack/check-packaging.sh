#!/usr/bin/env bash
# `make check-packaging`: every check of what users install that needs no cluster. The
# server-side dry-run of each manifest against a real API server is in e2e/tests/e2e/manifests.rs.
#
#   derived files   e2e/hack/sync-packaging.sh --check (chart CRDs, PrometheusRule, chart files)
#   Argo CD health  lua5.4 config/argocd/run-health-tests.lua (health.lua over its fixtures)
#   Flux / kstatus  go test in e2e/kstatus (sigs.k8s.io/cli-utils status.Compute, same fixtures)
#   Helm chart      helm lint --strict, helm template (defaults, and every toggle on), and
#                   e2e/hack/test-helm-values.sh (each admin value rendered, bad ones rejected)
#   alerts          promtool check rules, promtool test rules
#   dashboard       JSON parses; every PromQL expression parses (promtool, as recording rules)
#   kustomize       kubectl kustomize config/, e2e/overlays/monitoring, e2e/overlays/real-nodes,
#                   e2e/overlays/simulated-gpus, e2e/overlays/nvidia-dra (the
#                   without-agent component) and the two driver-root overlays
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
step() { echo "== $*" >&2; }

step "derived files are in sync with their sources"
bash e2e/hack/sync-packaging.sh --check

step "Argo CD health check (lua5.4)"
lua5.4 config/argocd/run-health-tests.lua config/argocd

step "kstatus (sigs.k8s.io/cli-utils) over the same fixtures"
(cd e2e/kstatus && go vet ./... && go test -count=1 ./...)

(cd e2e/pause && go vet ./...)

step "Helm chart"
helm=$(bash e2e/hack/build-helm.sh)
chart=config/helm/switchyard
all_on=(--set serviceMonitor.enabled=true,prometheusRule.enabled=true,dashboard.enabled=true,networkPolicy.enabled=true)
"$helm" lint --strict "$chart"
"$helm" lint --strict "$chart" "${all_on[@]}"
"$helm" template switchyard "$chart" -n switchyard-system > "$tmp/helm-default.yaml"
"$helm" template switchyard "$chart" -n switchyard-system "${all_on[@]}" > "$tmp/helm-all.yaml"
echo "helm template: $(grep -c '^kind:' "$tmp/helm-default.yaml") objects by default, $(grep -c '^kind:' "$tmp/helm-all.yaml") with every toggle on" >&2
if "$helm" template switchyard "$chart" --set operator.replica=3 >/dev/null 2>&1; then
  echo "values.schema.json accepted an unknown key (operator.replica)" >&2; exit 1
fi
# The simulated inventory (clusters without GPUs): its ConfigMap, the flag and the mount, or a
# clear error when the inventory itself is missing.
"$helm" template switchyard "$chart" -n switchyard-system --set agent.inventory=simulated \
  --set-file agent.simulatedInventory=driver-agent/examples/sim-inventory.yaml > "$tmp/helm-sim.yaml"
for want in "--inventory=simulated" "--sim-config=/etc/switchyard/simulated-gpus/inventory.yaml" \
            "name: switchyard-simulated-gpus" "driverVersion:"; do
  grep -qF -- "$want" "$tmp/helm-sim.yaml" || { echo "helm template (simulated): no '$want'" >&2; exit 1; }
done
if err=$("$helm" template switchyard "$chart" --set agent.inventory=simulated 2>&1 >/dev/null); then
  echo "helm template accepted agent.inventory=simulated without agent.simulatedInventory" >&2; exit 1
fi
grep -qF "agent.simulatedInventory is required" <<<"$err" || { echo "unexpected error: $err" >&2; exit 1; }
if "$helm" template switchyard "$chart" --set agent.inventory=fake >/dev/null 2>&1; then
  echo "values.schema.json accepted agent.inventory=fake" >&2; exit 1
fi
# Every admin value (logging, selector, scheduling, kubelet and CDI dirs, images, pull secrets)
# rendered into its object, and the bad ones rejected.
HELM="$helm" bash e2e/hack/test-helm-values.sh

step "Prometheus rules (promtool)"
promtool check rules config/prometheus/rules.yaml
(cd config/prometheus && promtool test rules rules_test.yaml)

step "Grafana dashboard"
dash=config/dashboards/switchyard.json
jq -e '.uid == "switchyard" and (.panels | length > 0)' "$dash" >/dev/null
# Grafana variables replaced by values of the same type, then each expression checked by
# promtool as the expr of a recording rule.
{
  echo "groups:"
  echo "- name: dashboard"
  echo "  rules:"
  jq -r '.panels[].targets[]?.expr' "$dash" \
    | sed -e 's/\$__rate_interval/5m/g' -e 's/\$pool/.*/g' \
    | awk '{ gsub(/\\/, "\\\\"); gsub(/"/, "\\\""); printf "  - record: dashboard:expr_%d\n    expr: \"%s\"\n", NR, $0 }'
} > "$tmp/dashboard-rules.yaml"
promtool check rules "$tmp/dashboard-rules.yaml"
# Every metric the components are specified to expose has a panel.
for m in switchyard_nodes switchyard_pool_gpus switchyard_backend_overlap_nodes switchyard_reconciliations_total \
         switchyard_reconcile_errors_total switchyard_reconcile_duration_seconds_bucket \
         switchyard_drain_duration_seconds_bucket switchyard_agent_devices switchyard_agent_publishes_total \
         switchyard_agent_publish_failures_total switchyard_agent_event_to_taint_seconds_bucket \
         switchyard_agent_nvml_errors_total scheduler_pending_pods scheduler_plugin_execution_duration_seconds_bucket \
         scheduler_framework_extension_point_duration_seconds_bucket dynamic_resource_allocation_resourceclaim_creates_total \
         scheduler_resourceclaim_creates_total resourceclaim_controller_creates_total dynamic_resource_allocation_resource_claims \
         resourceclaim_controller_resource_claims switchyard_cluster_gpus \
         switchyard_leader switchyard_migration_stalled; do
  grep -q "$m" "$dash" || { echo "dashboard: no panel queries $m" >&2; exit 1; }
done

step "kustomize (cached kubectl)"
kubectl="$(bash e2e/hack/build-controlplane.sh)/kubectl"
"$kubectl" kustomize config/ > "$tmp/kustomize.yaml"
"$kubectl" kustomize e2e/overlays/monitoring > "$tmp/kustomize-monitoring.yaml"
"$kubectl" kustomize e2e/overlays/real-nodes > "$tmp/kustomize-real-nodes.yaml"
for root in host:/ gpu-operator:/run/nvidia/driver; do
  "$kubectl" kustomize "e2e/overlays/driver-root-${root%%:*}" > "$tmp/kustomize-driver-root.yaml"
  grep -qF -- "path: ${root#*:}" "$tmp/kustomize-driver-root.yaml" \
    || { echo "kustomize (driver-root-${root%%:*} component): no host path ${root#*:}" >&2; exit 1; }
done
"$kubectl" kustomize e2e/overlays/simulated-gpus > "$tmp/kustomize-simulated-gpus.yaml"
for want in "--inventory=simulated" "--sim-config=/etc/switchyard/simulated-gpus/inventory.yaml" \
            "name: switchyard-simulated-gpus"; do
  grep -qF -- "$want" "$tmp/kustomize-simulated-gpus.yaml" || { echo "kustomize (simulated-gpus component): no '$want'" >&2; exit 1; }
done
"$kubectl" kustomize e2e/overlays/nvidia-dra > "$tmp/kustomize-nvidia-dra.yaml"
grep -qF -- "name: switchyard-operator" "$tmp/kustomize-nvidia-dra.yaml" \
  || { echo "kustomize (without-agent component): the operator is gone too" >&2; exit 1; }
left=$(awk '/^kind:/ {kind = $2} /^  name: switchyard-driver-agent/ {print kind}' "$tmp/kustomize-nvidia-dra.yaml" \
  | grep -E '^(DaemonSet|Service|ValidatingAdmissionPolicy|ValidatingAdmissionPolicyBinding)$' || true)
[ -z "$left" ] || { echo "kustomize (without-agent component): the agent's $left is left" >&2; exit 1; }
# The real nodes run the agent on its NVML path, against the driver root nodes-up.sh lays out.
for want in "--inventory=nvml" "--driver-root=/driver-root" "--dev-root=/run/nvidia/driver" "path: /run/nvidia/driver"; do
  grep -qF -- "$want" "$tmp/kustomize-real-nodes.yaml" || { echo "kustomize (e2e/overlays/real-nodes): no '$want'" >&2; exit 1; }
done
grep -qF -- "--inventory=nvml" "$tmp/kustomize.yaml" || { echo "kustomize: config/ no longer defaults to --inventory=nvml" >&2; exit 1; }
echo "kustomize: $(grep -c '^kind:' "$tmp/kustomize.yaml") objects in config/, $(grep -c '^kind:' "$tmp/kustomize-monitoring.yaml") with the monitoring component" >&2

echo "check-packaging: all checks passed" >&2
