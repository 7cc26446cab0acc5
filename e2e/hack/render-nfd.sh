#!/usr/bin/env bash
# Renders Node Feature Discovery's master as its own Helm chart makes it: the chart of the module
# e2e/nfd/go.mod pins (sigs.k8s.io/node-feature-discovery, deployment/helm/node-feature-discovery),
# CRDs included, rendered by the cached helm (e2e/hack/build-helm.sh) and printed as YAML.
#
# nfd-master is the part GPU Feature Discovery needs: it writes the labels GFD publishes as
# NodeFeature objects onto the nodes. Values:
#   master.extraLabelNs=[nvidia.com]          as NVIDIA's device-plugin chart sets it for GFD
#   worker.enable=false, gc.enable=false      nfd-worker reads the host's PCI devices and nfd-gc
#                                             prunes objects of deleted nodes; neither is in GFD's
#                                             path, and neither is built here
#   postDeleteCleanup=false                   the chart's post-delete hook (a Job running
#                                             `nfd-master -prune`) is Helm's to run at uninstall;
#                                             applied with kubectl it would run at install
#   image                                     the image e2e/hack/build-images.sh packs
#
#   render-nfd.sh [HELM-ARGS...]      extra arguments go to `helm template`
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
helm=${HELM:-$(bash "$here/hack/build-helm.sh")}
read -r version dir < <(cd "$here/nfd" && go mod download -json sigs.k8s.io/node-feature-discovery \
  | jq -r '"\(.Version) \(.Dir)"')
chart="$dir/deployment/helm/node-feature-discovery"
[ -f "$chart/Chart.yaml" ] || { echo "render-nfd: no chart at $chart" >&2; exit 1; }

"$helm" template node-feature-discovery "$chart" \
  --namespace node-feature-discovery \
  --include-crds \
  --set-json 'master.extraLabelNs=["nvidia.com"]' \
  --set worker.enable=false \
  --set gc.enable=false \
  --set postDeleteCleanup=false \
  --set image.repository=switchyard.dev/e2e/node-feature-discovery \
  --set "image.tag=$version" \
  --set image.pullPolicy=IfNotPresent \
  "$@"
