//go:build tools

// Package nvidia pins NVIDIA's own components that the e2e world runs, built from the Go module
// proxy at the versions its go.mod names (e2e/hack/build-vendor.sh): GPU Feature Discovery and
// the device plugin of github.com/NVIDIA/k8s-device-plugin.
package nvidia

import (
	_ "github.com/NVIDIA/k8s-device-plugin/cmd/config-manager"
	_ "github.com/NVIDIA/k8s-device-plugin/cmd/gpu-feature-discovery"
	_ "github.com/NVIDIA/k8s-device-plugin/cmd/nvidia-device-plugin"
)
