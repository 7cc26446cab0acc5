#!/usr/bin/env bash
# Renders NVIDIA's DRA driver for GPUs as its own Helm chart makes it: the chart of the module
# e2e/nvidia-dra/go.mod pins (sigs.k8s.io/dra-driver-nvidia-gpu, deployments/helm), rendered by the
# cached helm (e2e/hack/build-helm.sh) and printed as YAML. The e2e suite applies it unchanged.
#
# The values are those a cluster moving off the device plugin with Switchyard sets (see
# config/samples/gpupoolmigration-nvidia-dra.yaml):
#   nvidiaDriverRoot=/run/nvidia/driver      the GPU Operator's driver root, as on the real nodes
#   gpuResourcesEnabledOverride=true         the chart refuses GPUs without it while the device
#                                            plugin may run on the same nodes; Switchyard's
#                                            placement is what keeps them apart
#   resources.computeDomains.enabled=false   no NVLink fabric (IMEX) on these nodes
#   kubeletPlugin.nodeSelector               only nodes Switchyard has switched to DRA
#   image                                    the image e2e/hack/build-images.sh packs
#
#   render-nvidia-dra.sh [HELM-ARGS...]      extra arguments go to `helm template`
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
helm=${HELM:-$(bash "$here/hack/build-helm.sh")}
read -r version dir < <(cd "$here/nvidia-dra" && go mod download -json sigs.k8s.io/dra-driver-nvidia-gpu \
  | jq -r '"\(.Version) \(.Dir)"')
chart="$dir/deployments/helm/dra-driver-nvidia-gpu"
[ -f "$chart/Chart.yaml" ] || { echo "render-nvidia-dra: no chart at $chart" >&2; exit 1; }

"$helm" template dra-driver-nvidia-gpu "$chart" \
  --namespace nvidia-dra-driver-gpu \
  --api-versions resource.k8s.io/v1 \
  --set nvidiaDriverRoot=/run/nvidia/driver \
  --set gpuResourcesEnabledOverride=true \
  --set resources.computeDomains.enabled=false \
  --set-json 'kubeletPlugin.nodeSelector={"switchyard.dev/gpu-backend":"dra"}' \
  --set image.repository=switchyard.dev/e2e/dra-driver-nvidia-gpu \
  --set "image.tag=$version" \
  "$@"
