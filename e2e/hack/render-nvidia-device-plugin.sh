#!/usr/bin/env bash
# Renders NVIDIA's device plugin and GPU Feature Discovery as their own Helm chart makes them: the
# chart of the module e2e/nvidia/go.mod pins (github.com/NVIDIA/k8s-device-plugin,
# deployments/helm/nvidia-device-plugin), rendered by the cached helm (e2e/hack/build-helm.sh) and
# printed as YAML.
#
# Values, as a cluster that shares its GPUs sets them, on the real nodes' GPU Operator driver root:
#   config.map (default, renamed)   e2e/manifests/nvidia-device-plugin-configs/: time-slicing, 2
#                                   replicas per GPU, the second with renameByDefault; the chart's
#                                   config-manager picks one per node by the node's
#                                   nvidia.com/device-plugin.config label, else `default`
#   gfd.enabled=true                GPU Feature Discovery beside the plugin, publishing its labels
#                                   as NodeFeature objects (its default)
#   nfd.enabled=false               Node Feature Discovery comes from its own chart
#                                   (render-nfd.sh), at the version e2e/nfd/go.mod pins, not the
#                                   subchart's
#   nvidiaDriverRoot, deviceDiscoveryStrategy=nvml, compatWithCPUManager=true (the kubelet passes
#   the device nodes: no NVIDIA container runtime here), securityContext and gfd.securityContext
#   without privileged (which compatWithCPUManager and GFD default to; nothing here needs it)
#
#   render-nvidia-device-plugin.sh [HELM-ARGS...]   extra arguments go to `helm template`
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
helm=${HELM:-$(bash "$here/hack/build-helm.sh")}
read -r version dir < <(cd "$here/nvidia" && go mod download -json github.com/NVIDIA/k8s-device-plugin \
  | jq -r '"\(.Version) \(.Dir)"')
chart="$dir/deployments/helm/nvidia-device-plugin"
[ -f "$chart/Chart.yaml" ] || { echo "render-nvidia-device-plugin: no chart at $chart" >&2; exit 1; }
configs="$here/manifests/nvidia-device-plugin-configs"
unprivileged='{"allowPrivilegeEscalation":false,"capabilities":{"drop":["ALL"]}}'

"$helm" template nvidia-device-plugin "$chart" \
  --namespace nvidia-device-plugin \
  --set-file config.map.default="$configs/default.yaml" \
  --set-file config.map.renamed="$configs/renamed.yaml" \
  --set config.default=default \
  --set gfd.enabled=true \
  --set nfd.enabled=false \
  --set nvidiaDriverRoot=/run/nvidia/driver \
  --set deviceDiscoveryStrategy=nvml \
  --set compatWithCPUManager=true \
  --set failOnInitError=false \
  --set-json "securityContext=$unprivileged" \
  --set-json "gfd.securityContext=$unprivileged" \
  --set gfd.securityContext.privileged=false \
  --set image.repository=switchyard.dev/e2e/nvidia-k8s-device-plugin \
  --set "image.tag=$version" \
  "$@"
