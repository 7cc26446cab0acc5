//go:build tools

// Package kueue pins Kueue, which the e2e world runs as a cluster's job queueing, built from the
// Go module proxy at the version its go.mod names (e2e/hack/build-vendor.sh kueue). The proxy lists only
// older versions: the version is pinned exactly.
package kueue

import (
	_ "sigs.k8s.io/kueue/cmd/kueue"
)
