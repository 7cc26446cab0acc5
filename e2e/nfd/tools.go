//go:build tools

// Package nfd pins Node Feature Discovery's master, which the e2e world runs beside NVIDIA's GPU
// Feature Discovery: GFD publishes its labels as NodeFeature objects and nfd-master writes them
// onto the nodes, as in a GPU Operator install. Built from the Go module proxy at the version its
// go.mod names (e2e/hack/build-vendor.sh nfd-master). It has its own module because it builds
// against k8s.io/kubernetes (e2e/hack/gen-controlplane-gomod.sh writes its go.mod).
package nfd

import (
	_ "sigs.k8s.io/node-feature-discovery/cmd/nfd-master"
)
