#!/usr/bin/env bash
# Renders the chart with each of its admin values set and checks that the value lands in the
# right object (the operator Deployment or the agent DaemonSet), that the defaults add nothing,
# and that values.schema.json rejects bad values. Called by e2e/hack/check-packaging.sh
# (`make check-packaging`); needs only the cached helm (e2e/hack/build-helm.sh).
#
# Checks compare text: a block of rendered YAML, indentation included, must appear in (or be
# absent from) one object of `helm template`.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

helm=${HELM:-$(bash e2e/hack/build-helm.sh)}
chart=config/helm/switchyard
app_version=$(sed -n 's/^appVersion: "\(.*\)"$/\1/p' "$chart/Chart.yaml")
[ -n "$app_version" ] || { echo "test-helm-values: no appVersion in $chart/Chart.yaml" >&2; exit 1; }
digest="sha256:$(printf '0123456789abcdef%.0s' 1 2 3 4)"
checks=0

fail() { echo "helm values: $*" >&2; exit 1; }

# render NAME [helm template flags...]: the whole output in $tmp/NAME.yaml, and the two objects
# under test in $tmp/NAME.operator.yaml (Deployment) and $tmp/NAME.agent.yaml (DaemonSet).
render() {
  local name=$1; shift
  "$helm" template switchyard "$chart" -n switchyard-system "$@" > "$tmp/$name.yaml" \
    || fail "$name: helm template failed ($*)"
  object "$tmp/$name.yaml" Deployment switchyard-operator > "$tmp/$name.operator.yaml"
  object "$tmp/$name.yaml" DaemonSet switchyard-driver-agent > "$tmp/$name.agent.yaml"
  [ -s "$tmp/$name.operator.yaml" ] || fail "$name: no operator Deployment rendered"
  [ -s "$tmp/$name.agent.yaml" ] || fail "$name: no agent DaemonSet rendered"
}

# object FILE KIND NAME: the YAML document of that kind and metadata.name.
object() {
  awk -v kind="$2" -v name="$3" '
    function flush() { if (k && n) printf "%s", buf; buf = ""; k = 0; n = 0 }
    /^---$/ { flush(); next }
    { buf = buf $0 "\n" }
    $0 == "kind: " kind { k = 1 }
    $0 == "  name: " name { n = 1 }
    END { flush() }' "$1"
}

# has NAME operator|agent TEXT: TEXT (one or more whole lines) is in that object.
has() {
  local doc
  doc=$(cat "$tmp/$1.$2.yaml")
  [[ "$doc" == *"$3"* ]] || fail "$1: the $2 lacks:"$'\n'"$3"$'\n'"rendered: $tmp/$1.$2.yaml"$'\n'"$doc"
  checks=$((checks + 1))
}

# lacks NAME operator|agent TEXT: TEXT is nowhere in that object.
lacks() {
  local doc
  doc=$(cat "$tmp/$1.$2.yaml")
  [[ "$doc" != *"$3"* ]] || fail "$1: the $2 should not contain:"$'\n'"$3"$'\n'"$doc"
  checks=$((checks + 1))
}

# rejects WHAT ERROR_TEXT [helm template flags...]: the schema refuses the values; ERROR_TEXT is part
# of helm's message, which names the value by its JSON pointer (`at '/operator/logFormat': ...`).
rejects() {
  local what=$1 want=$2 err; shift 2
  if err=$("$helm" template switchyard "$chart" -n switchyard-system "$@" 2>&1 >/dev/null); then
    fail "accepted $what"
  fi
  grep -qF -- "$want" <<<"$err" || fail "rejected $what, but without '$want': $err"
  checks=$((checks + 1))
}

values() { cat > "$tmp/$1.values.yaml"; echo "$tmp/$1.values.yaml"; }

# The anti-affinity the operator gets unless operator.affinity.podAntiAffinity is set.
spread='        podAntiAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
          - weight: 100
            podAffinityTerm:
              topologyKey: kubernetes.io/hostname'
# The agent's own node affinity, which must survive agent.nodeSelector.
dra_affinity='      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
            - matchExpressions:
              - key: switchyard.dev/gpu-backend
                operator: In
                values: [dra]'

# --- defaults: none of the new values renders anything ----------------------------------------
render default
has default operator "        image: ghcr.io/switchyard-dev/switchyard-operator:$app_version
        imagePullPolicy: IfNotPresent
        env:"
has default agent "        image: ghcr.io/switchyard-dev/switchyard-driver-agent:$app_version
        imagePullPolicy: IfNotPresent"
has default operator "      affinity:
$spread"
has default agent "$dra_affinity"
for text in "args:" "RUST_LOG" "SWITCHYARD_LOG_FORMAT" "priorityClassName:" "nodeSelector:" "tolerations:" "imagePullSecrets:" "@sha256:"; do
  lacks default operator "$text"
done
for text in "--kubelet-root" "--cdi-dir" "--log-format" "RUST_LOG" "nodeSelector:" "imagePullSecrets:" "@sha256:"; do
  lacks default agent "$text"
done
has default agent "        - --kubelet-plugin
        env:
        - name: NODE_NAME
          valueFrom:
            fieldRef:
              fieldPath: spec.nodeName
        # Not /dev/termination-log"
has default agent "      priorityClassName: system-node-critical"
has default agent "      tolerations:
        - effect: NoSchedule
          key: nvidia.com/gpu
          operator: Exists"
for path in /var/lib/kubelet/plugins_registry /var/lib/kubelet/plugins/gpu.switchyard.dev /var/run/cdi; do
  has default agent "          mountPath: $path"
  has default agent "          path: $path"
done
# The values file spelled out is the same as the defaults.
"$helm" template switchyard "$chart" -n switchyard-system -f "$chart/values.yaml" > "$tmp/explicit.yaml"
cmp -s "$tmp/default.yaml" "$tmp/explicit.yaml" || fail "-f values.yaml renders differently from the defaults"
checks=$((checks + 1))

# --- logLevel, logFormat ----------------------------------------------------------------------
render logging -f "$(values logging <<'EOF'
operator:
  logLevel: info,switchyard_operator=debug
  logFormat: json
agent:
  logLevel: warn,switchyard_driver_agent::plugin=trace
  logFormat: json
EOF
)"
has logging operator '              fieldPath: metadata.name
        - name: RUST_LOG
          value: "info,switchyard_operator=debug"
        - name: SWITCHYARD_LOG_FORMAT
          value: json
        ports:'
has logging agent '              fieldPath: spec.nodeName
        - name: RUST_LOG
          value: "warn,switchyard_driver_agent::plugin=trace"'
has logging agent "        - --kubelet-plugin
        - --log-format=json
        env:"
render logging-text --set agent.logFormat=text --set operator.logFormat=text
has logging-text agent "        - --log-format=text"
has logging-text operator "        - name: SWITCHYARD_LOG_FORMAT
          value: text"
render operator-log --set operator.logLevel=debug
has operator-log operator '          value: "debug"'
lacks operator-log agent "RUST_LOG"
rejects "operator.logFormat=xml" "/operator/logFormat" --set operator.logFormat=xml
rejects "agent.logFormat=JSON" "/agent/logFormat" --set agent.logFormat=JSON

# --- operator: selector, extraArgs, extraEnv ----------------------------------------------------
render selector -f "$(values selector <<'EOF'
operator:
  selector: switchyard.dev/shard in (a,b)
  extraArgs: [--lease-name=switchyard-shard-a, --no-leader-election]
  extraEnv:
  - name: SWITCHYARD_METRICS_ADDR
    value: 0.0.0.0:9090
  - name: NODE_NAME
    valueFrom:
      fieldRef:
        fieldPath: spec.nodeName
EOF
)"
has selector operator "        imagePullPolicy: IfNotPresent
        args:
        - --selector=switchyard.dev/shard in (a,b)
        - --lease-name=switchyard-shard-a
        - --no-leader-election
        env:"
has selector operator "              fieldPath: metadata.name
        - name: SWITCHYARD_METRICS_ADDR
          value: 0.0.0.0:9090
        - name: NODE_NAME
          valueFrom:
            fieldRef:
              fieldPath: spec.nodeName
        ports:"
lacks selector agent "--selector"
lacks selector agent "SWITCHYARD_METRICS_ADDR"
render selector-only --set operator.selector=switchyard.dev/shard=a
has selector-only operator "        args:
        - --selector=switchyard.dev/shard=a
        env:"
render extra-args-only --set-json 'operator.extraArgs=["--lease-name=x"]'
has extra-args-only operator "        args:
        - --lease-name=x
        env:"
rejects "operator.extraArgs with a number" "/operator/extraArgs/0" --set-json 'operator.extraArgs=[1]'
rejects "operator.extraEnv without a name" "/operator/extraEnv/0" --set-json 'operator.extraEnv=[{"value":"x"}]'

# --- operator: scheduling ---------------------------------------------------------------------
render op-sched -f "$(values op-sched <<'EOF'
operator:
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms:
        - matchExpressions:
          - {key: node-role.kubernetes.io/infra, operator: Exists}
  tolerations:
  - {key: node-role.kubernetes.io/infra, operator: Exists, effect: NoSchedule}
  nodeSelector:
    kubernetes.io/os: linux
  priorityClassName: system-cluster-critical
  resources:
    requests: {cpu: 200m, memory: 256Mi}
    limits: {memory: 1Gi}
EOF
)"
has op-sched operator "      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
            - matchExpressions:
              - key: node-role.kubernetes.io/infra
                operator: Exists
$spread"
has op-sched operator "      tolerations:
        - effect: NoSchedule
          key: node-role.kubernetes.io/infra
          operator: Exists"
has op-sched operator "      nodeSelector:
        kubernetes.io/os: linux"
has op-sched operator "      priorityClassName: system-cluster-critical"
has op-sched operator "        resources:
          limits:
            memory: 1Gi
          requests:
            cpu: 200m
            memory: 256Mi"
lacks op-sched agent "node-role.kubernetes.io/infra"
has op-sched agent "      priorityClassName: system-node-critical"
# podAntiAffinity replaces the default spread; {} removes it.
render no-spread --set-json 'operator.affinity={"podAntiAffinity":{}}'
has no-spread operator "      affinity:
        podAntiAffinity: {}"
lacks no-spread operator "topologyKey: kubernetes.io/hostname"
render zone-spread --set-json 'operator.affinity={"podAntiAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":[{"topologyKey":"topology.kubernetes.io/zone","labelSelector":{"matchLabels":{"app.kubernetes.io/name":"switchyard-operator"}}}]}}'
has zone-spread operator "        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
          - labelSelector:
              matchLabels:
                app.kubernetes.io/name: switchyard-operator
            topologyKey: topology.kubernetes.io/zone"
lacks zone-spread operator "topologyKey: kubernetes.io/hostname"
rejects "operator.affinity.nodeAfinity (typo)" "'nodeAfinity' not allowed" --set-json 'operator.affinity={"nodeAfinity":{}}'
rejects "an unknown key under operator (operator.selectr)" "'selectr' not allowed" --set operator.selectr=a=b

# --- agent: scheduling ------------------------------------------------------------------------
render ag-sched -f "$(values ag-sched <<'EOF'
agent:
  nodeSelector:
    nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3
  tolerations:
  - {key: dedicated, operator: Equal, value: gpu, effect: NoExecute}
  priorityClassName: gpu-infra
  resources:
    requests: {cpu: 100m, memory: 128Mi}
    limits: {memory: 2Gi}
EOF
)"
has ag-sched agent "$dra_affinity
      nodeSelector:
        nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3
      tolerations:
        - effect: NoExecute
          key: dedicated
          operator: Equal
          value: gpu"
lacks ag-sched agent "key: nvidia.com/gpu"
has ag-sched agent "      priorityClassName: gpu-infra"
has ag-sched agent "        resources:
          limits:
            memory: 2Gi
          requests:
            cpu: 100m
            memory: 128Mi"
lacks ag-sched operator "nodeSelector:"
render ag-none --set-json 'agent.tolerations=[]' --set agent.priorityClassName=
lacks ag-none agent "tolerations:"
lacks ag-none agent "priorityClassName:"

# --- agent: kubeletRootDir, cdiDir ------------------------------------------------------------
render dirs --set agent.kubeletRootDir=/data/kubelet --set agent.cdiDir=/etc/cdi
has dirs agent "        - --kubelet-plugin
        - --kubelet-root=/data/kubelet
        - --cdi-dir=/etc/cdi
        env:"
has dirs agent "        - name: plugins-registry
          mountPath: /data/kubelet/plugins_registry
        - name: plugin-dir
          mountPath: /data/kubelet/plugins/gpu.switchyard.dev
        - name: cdi
          mountPath: /etc/cdi"
has dirs agent "      - name: plugins-registry
        hostPath:
          path: /data/kubelet/plugins_registry
          type: Directory
      - name: plugin-dir
        hostPath:
          path: /data/kubelet/plugins/gpu.switchyard.dev
          type: DirectoryOrCreate
      - name: cdi
        hostPath:
          path: /etc/cdi
          type: DirectoryOrCreate"
lacks dirs agent "/var/lib/kubelet"
lacks dirs agent "/var/run/cdi"
render dirs-sim --set agent.kubeletRootDir=/data/kubelet --set agent.inventory=simulated \
  --set-file agent.simulatedInventory=driver-agent/examples/sim-inventory.yaml
has dirs-sim agent "        - --sim-config=/etc/switchyard/simulated-gpus/inventory.yaml
        - --kubelet-root=/data/kubelet
        env:"
rejects "a relative agent.kubeletRootDir" "/agent/kubeletRootDir" --set agent.kubeletRootDir=var/lib/kubelet
rejects "agent.cdiDir with a trailing slash" "/agent/cdiDir" --set agent.cdiDir=/etc/cdi/

# --- agent: driverRoot, runtimeClassName -------------------------------------------------------
render driver-root --set agent.driverRoot=/run/nvidia/driver --set agent.runtimeClassName=nvidia \
  --set agent.devRoot=/run/nvidia/driver
has driver-root agent "        - --kubelet-plugin
        - --driver-root=/driver-root
        - --dev-root=/run/nvidia/driver
        env:"
has driver-root agent "        - name: driver-root
          mountPath: /driver-root
          readOnly: true"
has driver-root agent "      - name: driver-root
        hostPath:
          path: /run/nvidia/driver
          type: Directory"
has driver-root agent "      terminationGracePeriodSeconds: 30
      runtimeClassName: nvidia
      affinity:"
render host-root --set agent.driverRoot=/
has host-root agent "          path: /
          type: Directory"
lacks host-root agent "runtimeClassName"
render host-dev-root --set agent.devRoot=/
lacks host-dev-root agent "--dev-root"
lacks default agent "--dev-root"
rejects "a relative agent.devRoot" "/agent/devRoot" --set agent.devRoot=run/nvidia/driver
lacks default agent "driver-root"
lacks default agent "runtimeClassName"
rejects "a relative agent.driverRoot" "/agent/driverRoot" --set agent.driverRoot=run/nvidia/driver

# --- agent: extraArgs, extraEnv ---------------------------------------------------------------
render ag-extra -f "$(values ag-extra <<'EOF'
agent:
  extraArgs: [--health-hold-seconds=600, "--benign-xids=13,31,43"]
  extraEnv:
  - {name: NVIDIA_DRIVER_ROOT, value: /run/nvidia/driver}
EOF
)"
has ag-extra agent "        - --kubelet-plugin
        - --health-hold-seconds=600
        - --benign-xids=13,31,43
        env:"
has ag-extra agent "              fieldPath: spec.nodeName
        - name: NVIDIA_DRIVER_ROOT
          value: /run/nvidia/driver
        # Not /dev/termination-log"
lacks ag-extra operator "NVIDIA_DRIVER_ROOT"
rejects "an unknown key under agent (agent.kubeletRoot)" "'kubeletRoot' not allowed" --set agent.kubeletRoot=/data/kubelet

# --- images -----------------------------------------------------------------------------------
render images -f "$(values images <<EOF
operator:
  image:
    registry: registry.example.com/team
    repository: switchyard-operator
    tag: "1.2.3"
    digest: "$digest"
    pullPolicy: Always
agent:
  image:
    registry: registry.example.com:5000
    repository: mirror/switchyard-driver-agent
    pullPolicy: Never
EOF
)"
has images operator "        image: registry.example.com/team/switchyard-operator:1.2.3@$digest
        imagePullPolicy: Always"
has images agent "        image: registry.example.com:5000/mirror/switchyard-driver-agent:$app_version
        imagePullPolicy: Never"
render digest-only --set "agent.image.digest=$digest"
has digest-only agent "        image: ghcr.io/switchyard-dev/switchyard-driver-agent:$app_version@$digest"
has digest-only operator "        image: ghcr.io/switchyard-dev/switchyard-operator:$app_version
        imagePullPolicy: IfNotPresent"
render global-registry --set global.imageRegistry=mirror.example.com --set operator.image.registry=registry.example.com
has global-registry operator "        image: registry.example.com/ghcr.io/switchyard-dev/switchyard-operator:$app_version"
has global-registry agent "        image: mirror.example.com/ghcr.io/switchyard-dev/switchyard-driver-agent:$app_version"
# global stays open to the globals a parent chart passes down.
render parent-globals --set global.storageClass=fast --set global.imageRegistry=mirror.example.com
has parent-globals operator "        image: mirror.example.com/ghcr.io/switchyard-dev/switchyard-operator:$app_version"
rejects "a global.imageRegistry with a scheme" "/global/imageRegistry" --set global.imageRegistry=https://mirror.example.com
rejects "a short digest" "/operator/image/digest" --set operator.image.digest=sha256:abc
rejects "a digest without its algorithm" "/agent/image/digest" --set "agent.image.digest=${digest#sha256:}"
rejects "an image.registry with a trailing slash" "/operator/image/registry" --set operator.image.registry=registry.example.com/
rejects "an unknown key under operator.image (digests)" "'digests' not allowed" --set "operator.image.digests=$digest"
rejects "image.pullPolicy=Sometimes" "/agent/image/pullPolicy" --set agent.image.pullPolicy=Sometimes

# --- imagePullSecrets -------------------------------------------------------------------------
render pull-secrets --set-json 'imagePullSecrets=[{"name":"regcred"},{"name":"mirror"}]'
has pull-secrets operator "      serviceAccountName: switchyard-operator
      imagePullSecrets:
        - name: regcred
        - name: mirror"
has pull-secrets agent "      serviceAccountName: switchyard-driver-agent
      imagePullSecrets:
        - name: regcred
        - name: mirror"
rejects "an imagePullSecrets entry without a name" "/imagePullSecrets/0" --set-json 'imagePullSecrets=[{}]'

# --- operator.admissionPolicy: the policy, in the release's namespace, and off -----------------
grep -qF "request.userInfo.username == 'system:serviceaccount:switchyard-system:switchyard-operator'" "$tmp/default.yaml" \
  || fail "default: no operator admission policy for the operator's service account"
checks=$((checks + 1))
"$helm" template switchyard "$chart" -n gpu-infra > "$tmp/other-ns.yaml"
grep -qF "request.userInfo.username == 'system:serviceaccount:gpu-infra:switchyard-operator'" "$tmp/other-ns.yaml" \
  || fail "the operator admission policy does not follow the release namespace"
checks=$((checks + 1))
render no-op-policy --set operator.admissionPolicy.enabled=false
! grep -q "name: switchyard-operator-daemonset-placement" "$tmp/no-op-policy.yaml" \
  || fail "operator.admissionPolicy.enabled=false still renders the policy"
grep -q "name: switchyard-driver-agent-own-node-slices" "$tmp/no-op-policy.yaml" \
  || fail "operator.admissionPolicy.enabled=false removed the agent's policy too"
checks=$((checks + 2))
rejects "operator.admissionPolicy.enabled=maybe" "/operator/admissionPolicy/enabled" --set operator.admissionPolicy.enabled=maybe

# --- agent.enabled=false: the operator alone, for another vendor's DRA driver -----------------
"$helm" template switchyard "$chart" -n switchyard-system --set agent.enabled=false \
  --set serviceMonitor.enabled=true --set networkPolicy.enabled=true > "$tmp/no-agent.yaml" \
  || fail "no-agent: helm template failed"
[ -n "$(object "$tmp/no-agent.yaml" Deployment switchyard-operator)" ] || fail "no-agent: the operator Deployment is gone too"
for kind in DaemonSet Service ValidatingAdmissionPolicy ValidatingAdmissionPolicyBinding ServiceMonitor NetworkPolicy; do
  for name in switchyard-driver-agent switchyard-driver-agent-metrics switchyard-driver-agent-own-node-slices; do
    [ -z "$(object "$tmp/no-agent.yaml" "$kind" "$name")" ] || fail "no-agent: $kind $name is rendered"
  done
  checks=$((checks + 1))
done
rejects "agent.enabled=maybe" "/agent/enabled" --set agent.enabled=maybe

# --- agent.sharesPerDevice: each GPU shared N ways, only when set --------------------------------
render shares --set agent.sharesPerDevice=4
has shares agent "        - --shares-per-device=4"
lacks default agent "--shares-per-device"
rejects "agent.sharesPerDevice=0" "/agent/sharesPerDevice" --set agent.sharesPerDevice=0

# --- everything at once passes helm lint --strict ----------------------------------------------
"$helm" lint --strict "$chart" -f "$tmp/logging.values.yaml" -f "$tmp/selector.values.yaml" \
  -f "$tmp/op-sched.values.yaml" -f "$tmp/ag-sched.values.yaml" -f "$tmp/ag-extra.values.yaml" \
  -f "$tmp/images.values.yaml" --set agent.kubeletRootDir=/data/kubelet,agent.cdiDir=/etc/cdi \
  --set-json 'imagePullSecrets=[{"name":"regcred"}]' > "$tmp/lint.txt" 2>&1 \
  || fail "helm lint --strict with every value set: $(cat "$tmp/lint.txt")"
checks=$((checks + 1))

echo "helm values: $checks checks passed" >&2
