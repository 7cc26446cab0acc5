#!/usr/bin/env bash
# Renders Kueue as its own Helm chart makes it: the chart of the module e2e/kueue/go.mod pins
# (sigs.k8s.io/kueue, charts/kueue), rendered by the cached helm (e2e/hack/build-helm.sh) and
# printed as YAML. The e2e suite applies it unchanged. Values: the image e2e/hack/build-images.sh
# packs, and e2e/manifests/kueue-config.yaml as the manager's configuration. Kueue manages its own
# webhook certificate (internal cert management, the chart's default).
#
#   render-kueue.sh [HELM-ARGS...]      extra arguments go to `helm template`
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
helm=${HELM:-$(bash "$here/hack/build-helm.sh")}
read -r version dir < <(cd "$here/kueue" && go mod download -json sigs.k8s.io/kueue | jq -r '"\(.Version) \(.Dir)"')
chart="$dir/charts/kueue"
[ -f "$chart/Chart.yaml" ] || { echo "render-kueue: no chart at $chart" >&2; exit 1; }

"$helm" template kueue "$chart" \
  --namespace kueue-system \
  --set controllerManager.manager.image.repository=switchyard.dev/e2e/kueue \
  --set "controllerManager.manager.image.tag=$version" \
  --set controllerManager.manager.image.pullPolicy=IfNotPresent \
  --set-file managerConfig.controllerManagerConfigYaml="$here/manifests/kueue-config.yaml" \
  "$@"
