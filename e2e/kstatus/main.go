// Command kstatus prints the status that kstatus (sigs.k8s.io/cli-utils/pkg/kstatus/status), the
// library Flux's health checks and `kubectl wait`-style tools use, computes for each
// GpuPoolMigration file given (JSON or YAML, one object per file).
//
//	go run . ../../config/argocd/switchyard.dev/GpuPoolMigration/testdata/*.yaml
package main

import (
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/yaml"
)

// compute reads one object from path and returns kstatus's result for it.
func compute(path string) (*status.Result, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	// Through JSON, so that integers stay int64 as the API machinery expects.
	json, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	obj := &unstructured.Unstructured{}
	if err := obj.UnmarshalJSON(json); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return status.Compute(obj)
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: kstatus FILE...")
		os.Exit(2)
	}
	failed := false
	for _, path := range os.Args[1:] {
		res, err := compute(path)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", path, err)
			failed = true
			continue
		}
		fmt.Printf("%s\t%s\t%s\n", path, res.Status, res.Message)
	}
	if failed {
		os.Exit(1)
	}
}
