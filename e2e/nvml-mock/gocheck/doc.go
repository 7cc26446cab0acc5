// Package gocheck loads the NVML mock (e2e/nvml-mock) through NVIDIA's own Go bindings, as
// NVIDIA's device plugin, GPU Feature Discovery and DRA driver load libnvidia-ml.so.1, and
// compares what they read with the inventory the mock was given. It holds only tests.
package gocheck
