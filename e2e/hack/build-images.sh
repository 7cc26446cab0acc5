#!/usr/bin/env bash
# The one recipe for every Switchyard image, run by `make images`. No container engine is needed:
# each image is a root filesystem staged in a directory, packed into one layer with GNU tar's
# reproducible flags, and assembled into an OCI image layout with umoci (Debian's `umoci`, a
# maintained OCI image tool). Each image is written as an OCI archive (a tar of the layout) that
# `ctr images import`, `skopeo copy oci-archive:...` and `podman load` all read.
#
#   build-images.sh [IMAGE...]    default: every image below
#
# Images (the chart and config/ name the first two):
#   switchyard-operator       ghcr.io/switchyard-dev/switchyard-operator:$VERSION
#   switchyard-driver-agent   ghcr.io/switchyard-dev/switchyard-driver-agent:$VERSION
#   pause                     registry.k8s.io/pause:3.10 (the e2e nodes' sandbox image and the
#                             migration canary's image in the samples)
#   workload                  switchyard.dev/e2e/gpu-workload:$VERSION (prints its env and /dev)
#   nvidia-device-plugin      switchyard.dev/e2e/nvidia-k8s-device-plugin:v0.19.3 (NVIDIA's device
#                             plugin, built from its module by e2e/hack/build-vendor.sh; the version
#                             is e2e/nvidia/go.mod's)
#   dra-driver-nvidia-gpu     switchyard.dev/e2e/dra-driver-nvidia-gpu:v0.5.0 (NVIDIA's DRA driver:
#                             its gpu-kubelet-plugin, nvidia-cdi-hook and the init container's
#                             kubelet-plugin-prestart.sh; the version is e2e/nvidia-dra/go.mod's)
#   kueue                     switchyard.dev/e2e/kueue:v0.19.2 (Kueue's manager, built from its
#                             module by e2e/hack/build-vendor.sh kueue; the version is e2e/kueue/go.mod's)
#   node-feature-discovery    switchyard.dev/e2e/node-feature-discovery:v0.18.3 (NFD's nfd-master,
#                             built by e2e/hack/build-vendor.sh; the version is e2e/nfd/go.mod's)
#
# Reproducible: every file has mtime 0 and uid/gid 0 in the layer, the config and history carry the
# epoch as their date, the Rust binaries are built with their build paths remapped, and the Go ones
# with -trimpath and no VCS stamp. The same commit gives the same manifest digest twice;
# e2e/hack/check-images.sh checks it before each e2e run.
#
#   SWITCHYARD_IMAGE_DIR   where the archives go (default: target/images)
#   SWITCHYARD_IMAGE_CLI   1: also build the switchyard CLI with the images' profile and flags
#                          (target/image/switchyard), as make demo does
#   IMAGE_REGISTRY         registry/owner of the product images (default: ghcr.io/switchyard-dev)
#
# To push: `skopeo copy oci-archive:target/images/switchyard-operator.tar docker://REGISTRY/...`.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
out=${SWITCHYARD_IMAGE_DIR:-$root/target/images}
registry=${IMAGE_REGISTRY:-ghcr.io/switchyard-dev}
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -n1)
[ -n "$version" ] || { echo "build-images: no workspace version in Cargo.toml" >&2; exit 1; }
epoch=1970-01-01T00:00:00Z

for tool in umoci tar jq sha256sum ldd; do
  command -v "$tool" >/dev/null || { echo "build-images: $tool is missing (make deps installs it)" >&2; exit 1; }
done

mkdir -p "$out"
work=$(mktemp -d "${TMPDIR:-/tmp}/switchyard-images.XXXXXX")
trap 'rm -rf "$work"' EXIT

# --- binaries -------------------------------------------------------------------------------
rust_bins() { # the workspace binaries, release profile "image", build paths remapped
  local flags="--remap-path-prefix=$root=/src --remap-path-prefix=${CARGO_HOME:-$HOME/.cargo}=/cargo"
  # SWITCHYARD_IMAGE_CLI=1 (make demo) builds the switchyard CLI in the same build: the demo then
  # needs no debug build of the workspace besides the images' (same profile, same flags).
  local cli=()
  [ "${SWITCHYARD_IMAGE_CLI:-0}" = 1 ] && cli=(-p switchyard-cli --bin switchyard)
  CARGO_ENCODED_RUSTFLAGS=$(printf '%s' "$flags" | tr ' ' '\037') \
    cargo build --locked --profile image -p switchyard-operator --bin switchyard-operator \
    -p switchyard-driver-agent --bin switchyard-driver-agent "${cli[@]}" >&2
  echo "$root/target/image"
}

go_bin() { # module dir, output: a static binary
  (cd "$root/$1" && CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags "-s -w" -o "$2" .)
}

# --- root filesystems -------------------------------------------------------------------------
# A glibc binary with the shared libraries it links, as distroless/cc carries them: ldd names them
# (the dynamic loader included) and each lands at the same path in the image.
stage_dynamic() { # rootfs binary dest
  local rootfs=$1 bin=$2 dest=$3 lib
  install -D -m 0755 "$bin" "$rootfs$dest"
  while read -r lib; do
    install -D -m 0755 "$(readlink -f "$lib")" "$rootfs$lib"
  done < <(ldd "$bin" | grep -o '/[^ ]*' | sort -u)
}

stage_base() { # rootfs: users, CA certificates, /tmp; what distroless adds besides the binary
  local rootfs=$1
  mkdir -p "$rootfs/etc/ssl/certs" "$rootfs/tmp"
  chmod 1777 "$rootfs/tmp"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' \
    > "$rootfs/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' > "$rootfs/etc/group"
  if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
    cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/"
  fi
}

# --- assembly -------------------------------------------------------------------------------
# pack NAME REF ROOTFS CONFIG-FLAGS...: one layer, the given config, an OCI archive in $out.
pack() {
  local name=$1 ref=$2 rootfs=$3; shift 3
  local layout="$work/$name-layout" layer="$work/$name-layer.tar"
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=posix \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    -C "$rootfs" -cf "$layer" .
  umoci init --layout "$layout"
  umoci new --image "$layout:img"
  umoci raw add-layer --image "$layout:img" --history.created "$epoch" \
    --history.created_by "e2e/hack/build-images.sh $name" "$layer"
  umoci config --image "$layout:img" --no-history --created "$epoch" --os linux --architecture amd64 \
    --config.label "org.opencontainers.image.source=https://github.com/switchyard-dev/switchyard" \
    --config.label "org.opencontainers.image.version=$version" "$@"
  umoci gc --layout "$layout"
  # containerd's importer names the image after this annotation; the tag umoci used is internal.
  jq --arg ref "$ref" '.manifests[0].annotations = {"io.containerd.image.name": $ref, "org.opencontainers.image.ref.name": $ref}' \
    "$layout/index.json" > "$layout/index.json.new"
  mv "$layout/index.json.new" "$layout/index.json"
  find "$layout" -exec touch -h -d @0 {} +
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=posix \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    -C "$layout" -cf "$out/$name.tar" .
  local digest
  digest=$(jq -r '.manifests[0].digest' "$layout/index.json")
  printf '%s %s %s\n' "$name" "$ref" "$digest" >> "$work/digests"
  echo "build-images: $ref $digest ($(du -h "$out/$name.tar" | cut -f1))" >&2
}

image_switchyard_operator() {
  local rootfs="$work/operator" bins; bins=$(rust_bins)
  stage_base "$rootfs"
  stage_dynamic "$rootfs" "$bins/switchyard-operator" /switchyard-operator
  pack switchyard-operator "$registry/switchyard-operator:$version" "$rootfs" \
    --config.user 65532:65532 --config.exposedports 8080/tcp --config.entrypoint /switchyard-operator
}

# The agent stays a glibc binary: NVML (libnvidia-ml.so.1, from the node's driver) is loaded with
# dlopen, which a static musl binary cannot do for a glibc library.
image_switchyard_driver_agent() {
  local rootfs="$work/agent" bins; bins=$(rust_bins)
  stage_base "$rootfs"
  stage_dynamic "$rootfs" "$bins/switchyard-driver-agent" /switchyard-driver-agent
  pack switchyard-driver-agent "$registry/switchyard-driver-agent:$version" "$rootfs" \
    --config.exposedports 8081/tcp --config.entrypoint /switchyard-driver-agent
}

image_pause() {
  local rootfs="$work/pause"
  mkdir -p "$rootfs"
  go_bin e2e/pause "$rootfs/pause"
  pack pause registry.k8s.io/pause:3.10 "$rootfs" --config.user 65535:65535 --config.entrypoint /pause
}

# Prints what a container sees of its GPUs: NVIDIA_* variables and the nvidia device nodes, then
# waits for SIGTERM. busybox-static (Debian) gives sh, env, ls and sleep in one static binary.
image_workload() {
  local rootfs="$work/workload" applet busybox=/bin/busybox
  if ldd "$busybox" >/dev/null 2>&1; then
    echo "build-images: $busybox is dynamically linked; install Debian's busybox-static (make deps)" >&2
    exit 1
  fi
  install -D -m 0755 "$busybox" "$rootfs/bin/busybox"
  for applet in sh env ls sleep cat grep sort; do ln -s busybox "$rootfs/bin/$applet"; done
  cat > "$rootfs/workload.sh" <<'EOF'
#!/bin/sh
# What the container was given: the device plugin sets NVIDIA_VISIBLE_DEVICES through Allocate, the
# DRA driver through its CDI spec; either way the GPUs arrive as /dev/nvidia<N> nodes.
echo "workload: NVIDIA_VISIBLE_DEVICES=${NVIDIA_VISIBLE_DEVICES:-<unset>}"
env | sort | grep -E '^(NVIDIA_|SWITCHYARD_)' | sed 's/^/workload: env /'
for d in /dev/nvidia*; do [ -e "$d" ] && ls -l "$d" | sed 's/^/workload: dev /'; done
echo "workload: ready"
trap 'exit 0' TERM INT
while :; do sleep 3600 & wait $!; done
EOF
  chmod 0755 "$rootfs/workload.sh"
  pack workload "switchyard.dev/e2e/gpu-workload:$version" "$rootfs" --config.entrypoint /workload.sh
}

# NVIDIA's k8s-device-plugin, unchanged: its nvidia-device-plugin, gpu-feature-discovery and
# config-manager commands at the paths NVIDIA's image has them (its Helm chart runs all three from
# the one image), with the glibc they link (go-nvml loads libnvidia-ml.so.1 with dlopen, so they
# are cgo binaries) and libgcc_s, which a distroless/cc base carries and NVIDIA's NVML library needs.
image_nvidia_device_plugin() {
  local rootfs="$work/nvidia-device-plugin" cmd dp_version lib
  dp_version=$(sed -n 's/^require github.com\/NVIDIA\/k8s-device-plugin \(v[0-9.]*\)$/\1/p' "$root/e2e/nvidia/go.mod")
  stage_base "$rootfs"
  for cmd in nvidia-device-plugin gpu-feature-discovery config-manager; do
    stage_dynamic "$rootfs" "$(bash "$root/e2e/hack/build-vendor.sh" "$cmd")" "/usr/bin/$cmd"
  done
  # awk reads all of ldconfig's output (no early exit): under pipefail, ldconfig killed by SIGPIPE
  # would fail the build.
  lib=$(ldconfig -p | awk '/libgcc_s\.so\.1 \(libc6,x86-64\)/ && !found {print $NF; found = 1}')
  [ -n "$lib" ] || { echo "build-images: libgcc_s.so.1 not found (ldconfig -p)" >&2; exit 1; }
  install -D -m 0644 "$(readlink -f "$lib")" "$rootfs$lib"
  pack nvidia-device-plugin "switchyard.dev/e2e/nvidia-k8s-device-plugin:$dp_version" "$rootfs" \
    --config.entrypoint /usr/bin/nvidia-device-plugin \
    --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
}

# NVIDIA's DRA driver, unchanged: gpu-kubelet-plugin and nvidia-cdi-hook where NVIDIA's image has
# them, and the module's hack/kubelet-plugin-prestart.sh, which its chart's init container runs with
# bash. The chart's command lines and that script use bash and GNU tools, staged from this machine
# with the libraries they link, as NVIDIA's distro-based image carries them.
image_dra_driver_nvidia_gpu() {
  local rootfs="$work/dra-driver-nvidia-gpu" plugin hook dra_version dir tool lib
  plugin=$(bash "$root/e2e/hack/build-vendor.sh" gpu-kubelet-plugin)
  hook=$(bash "$root/e2e/hack/build-vendor.sh" nvidia-cdi-hook)
  dra_version=$(cd "$root/e2e/nvidia-dra" && go list -m -f '{{.Version}}' sigs.k8s.io/dra-driver-nvidia-gpu)
  dir=$(cd "$root/e2e/nvidia-dra" && go list -m -f '{{.Dir}}' sigs.k8s.io/dra-driver-nvidia-gpu)
  stage_base "$rootfs"
  stage_dynamic "$rootfs" "$plugin" /usr/bin/gpu-kubelet-plugin
  stage_dynamic "$rootfs" "$hook" /usr/bin/nvidia-cdi-hook
  install -D -m 0755 "$dir/hack/kubelet-plugin-prestart.sh" "$rootfs/usr/bin/kubelet-plugin-prestart.sh"
  for tool in bash find ln date ls env head basename sleep cp sed mount; do
    stage_dynamic "$rootfs" "$(command -v "$tool")" "/usr/bin/$tool"
  done
  mkdir -p "$rootfs/bin"
  ln -s ../usr/bin/bash "$rootfs/bin/bash"
  ln -s bash "$rootfs/bin/sh"
  lib=$(ldconfig -p | awk '/libgcc_s\.so\.1 \(libc6,x86-64\)/ && !found {print $NF; found = 1}')
  [ -n "$lib" ] || { echo "build-images: libgcc_s.so.1 not found (ldconfig -p)" >&2; exit 1; }
  install -D -m 0644 "$(readlink -f "$lib")" "$rootfs$lib"
  pack dra-driver-nvidia-gpu "switchyard.dev/e2e/dra-driver-nvidia-gpu:$dra_version" "$rootfs" \
    --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
}

# Kueue, unchanged: its static manager at /manager, where Kueue's image has it, run as nonroot.
image_kueue() {
  local rootfs="$work/kueue" bin kueue_version
  bin=$(bash "$root/e2e/hack/build-vendor.sh" kueue)
  kueue_version=$(cd "$root/e2e/kueue" && go list -m -f '{{.Version}}' sigs.k8s.io/kueue)
  stage_base "$rootfs"
  install -D -m 0755 "$bin" "$rootfs/manager"
  pack kueue "switchyard.dev/e2e/kueue:$kueue_version" "$rootfs" --config.user 65532:65532 --config.entrypoint /manager
}

# Node Feature Discovery's nfd-master, unchanged, where NFD's image has it and as the user NFD's
# image runs as (65534, which the chart's runAsNonRoot requires): it writes the labels GPU Feature
# Discovery publishes as NodeFeature objects onto the nodes.
image_node_feature_discovery() {
  local rootfs="$work/node-feature-discovery" nfd_version
  nfd_version=$(cd "$root/e2e/nfd" && go list -m -f '{{.Version}}' sigs.k8s.io/node-feature-discovery)
  stage_base "$rootfs"
  stage_dynamic "$rootfs" "$(bash "$root/e2e/hack/build-vendor.sh" nfd-master)" /usr/bin/nfd-master
  pack node-feature-discovery "switchyard.dev/e2e/node-feature-discovery:$nfd_version" "$rootfs" \
    --config.user 65534:65534 --config.entrypoint /usr/bin/nfd-master --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
}

images=("$@")
[ "${#images[@]}" -gt 0 ] || images=(switchyard-operator switchyard-driver-agent pause workload nvidia-device-plugin dra-driver-nvidia-gpu kueue \
  node-feature-discovery)
: > "$work/digests"
for image in "${images[@]}"; do
  fn="image_${image//-/_}"
  declare -F "$fn" >/dev/null || { echo "build-images: no image named $image" >&2; exit 1; }
  "$fn"
done
# digests.txt: NAME REF DIGEST per image, merged with images built earlier.
touch "$out/digests.txt"
awk '!seen[$1]++' "$work/digests" "$out/digests.txt" | sort > "$work/digests.all"
mv "$work/digests.all" "$out/digests.txt"
