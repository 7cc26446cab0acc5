package main

import (
	"os"
	"path/filepath"
	"sort"
	"testing"

	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

// The Argo CD fixtures, so both GitOps tools are checked against the same recorded states.
const fixtures = "../../config/argocd/switchyard.dev/GpuPoolMigration/testdata"

// What kstatus says for each fixture, including two answers that differ from Argo CD and that the
// README's Flux section works around with healthCheckExprs:
//   - new.yaml: an object without any status is Current to kstatus (it only checks
//     observedGeneration when the field exists), so a Flux wait right after creation passes.
//   - paused.yaml: Ready=False makes kstatus say InProgress; Argo CD says Suspended. A Flux wait on
//     a paused migration runs into its timeout.
//
// Argo CD's Degraded states carry Stalled=True, so kstatus (and Flux) report Failed for them.
var want = map[string]status.Status{
	"new.yaml":         status.CurrentStatus,    // no status yet: see above
	"progressing.yaml": status.InProgressStatus, // Reconciling=True
	"observing.yaml":   status.InProgressStatus, // observedGeneration < generation
	"completed.yaml":   status.CurrentStatus,
	"rolledback.yaml":  status.CurrentStatus,
	"paused.yaml":      status.InProgressStatus, // Ready=False: see above
	"stalled.yaml":     status.FailedStatus,     // Stalled=True
	"failed.yaml":      status.FailedStatus,
	"refused.yaml":     status.FailedStatus, // Stalled=True: selected nodes are refused
	"overlap.yaml":     status.FailedStatus,
	// Recorded from real migrations by e2e/tests/e2e/migration/ (record_state).
	"recorded-progressing.yaml": status.InProgressStatus,
	"recorded-rollingback.yaml": status.InProgressStatus,
	"recorded-completed.yaml":   status.CurrentStatus,
	"recorded-paused.yaml":      status.InProgressStatus,
	"recorded-stalled.yaml":     status.FailedStatus,
	"recorded-rolledback.yaml":  status.CurrentStatus,
}

func TestFixtures(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(fixtures, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no fixtures in %s (%v)", fixtures, err)
	}
	sort.Strings(files)
	seen := map[string]bool{}
	for _, path := range files {
		name := filepath.Base(path)
		seen[name] = true
		t.Run(name, func(t *testing.T) {
			expected, ok := want[name]
			if !ok {
				t.Fatalf("fixture %s has no expected kstatus; add it to want", name)
			}
			res, err := compute(path)
			if err != nil {
				t.Fatal(err)
			}
			if res.Status != expected {
				t.Errorf("kstatus = %s (%q), want %s", res.Status, res.Message, expected)
			}
			t.Logf("%s: %s", res.Status, res.Message)
		})
	}
	for name := range want {
		if !seen[name] {
			t.Errorf("expected fixture %s is missing from %s", name, fixtures)
		}
	}
}

func TestMain(m *testing.M) {
	if _, err := os.Stat(fixtures); err != nil {
		panic(err)
	}
	os.Exit(m.Run())
}
