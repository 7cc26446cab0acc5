//go:build tools

// Package nvidiadra pins NVIDIA's DRA driver for GPUs, which the e2e world runs as a migration
// target, built from the Go module proxy at the version its go.mod names
// (e2e/hack/build-vendor.sh gpu-kubelet-plugin), and the nvidia-cdi-hook its image carries. It has
// its own module because it builds against k8s.io/kubernetes (e2e/hack/gen-controlplane-gomod.sh
// writes its go.mod), which k8s-device-plugin's module does not.
package nvidiadra

import (
	_ "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook"
	_ "sigs.k8s.io/dra-driver-nvidia-gpu/cmd/gpu-kubelet-plugin"
)
