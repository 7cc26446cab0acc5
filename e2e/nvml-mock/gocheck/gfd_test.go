package gocheck

import (
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// Two whole H100s, the inventory of the GPU Feature Discovery fixtures.
const twoH100 = `{
  "driverVersion": "580.95.05",
  "cudaDriverVersion": 13000,
  "gpus": [
    {"uuid": "GPU-11111111-2222-3333-4444-000000000000", "name": "NVIDIA H100 80GB HBM3",
     "memoryBytes": 85520809984, "pciBusId": "0000:18:00.0"},
    {"uuid": "GPU-11111111-2222-3333-4444-000000000001", "name": "NVIDIA H100 80GB HBM3",
     "memoryBytes": 85520809984, "pciBusId": "0000:2a:00.0", "minor": 3}
  ]
}`

// One H100 in MIG mode with two instances, the inventory of the MIG fixture.
const oneMigH100 = `{
  "driverVersion": "580.95.05",
  "cudaDriverVersion": 13000,
  "gpus": [
    {"uuid": "GPU-11111111-2222-3333-4444-000000000001", "name": "NVIDIA H100 80GB HBM3",
     "memoryBytes": 85520809984, "pciBusId": "0000:2a:00.0", "minor": 3,
     "migEnabled": true, "mig": [
       {"uuid": "MIG-aaaaaaaa-0000-4000-8000-000000000001", "profile": "1g.10gb", "memoryBytes": 10200547328,
        "gpuInstanceId": 9, "multiprocessors": 16, "gpuInstanceSlices": 1},
       {"uuid": "MIG-aaaaaaaa-0000-4000-8000-000000000002", "profile": "3g.40gb", "memoryBytes": 42580574208,
        "gpuInstanceId": 2, "multiprocessors": 60, "gpuInstanceSlices": 3}
     ]}
  ]
}`

// The device plugin's config for time-slicing, as its Helm chart renders one.
const timeSliced4 = `version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 4
`

// The same with renameByDefault: the shared GPUs are advertised as nvidia.com/gpu.shared, and GFD
// labels them under nvidia.com/gpu with a product that says nothing of the sharing.
const timeSliced4Renamed = `version: v1
sharing:
  timeSlicing:
    renameByDefault: true
    resources:
    - name: nvidia.com/gpu
      replicas: 4
`

// TestGpuFeatureDiscoveryLabelsTheMocksGpus runs NVIDIA's GPU Feature Discovery (k8s-device-plugin
// v0.19.3, built from its module by e2e/hack/build-vendor.sh) once against the mock, found as
// libnvidia-ml.so.1 on the library path as on a GPU node, and compares the labels it writes with
// operator/tests/fixtures/gfd/, which the operator's unit tests read as the labels Switchyard
// judges a node by (gpu.count, gpu.sharing-strategy, gpu.replicas, and each MIG profile's). The fixtures are GFD's output:
// when GFD or the mock changes what it writes, this test says so.
func TestGpuFeatureDiscoveryLabelsTheMocksGpus(t *testing.T) {
	gfd := os.Getenv("GFD_BIN")
	if gfd == "" {
		t.Fatal("GFD_BIN is not set: run e2e/hack/nvml-mock-check.sh, which builds GPU Feature Discovery first")
	}
	dir := t.TempDir()
	if err := os.Symlink(library(t), filepath.Join(dir, "libnvidia-ml.so.1")); err != nil {
		t.Fatal(err)
	}
	whole := filepath.Join(dir, "two-h100.json")
	mig := filepath.Join(dir, "mig-h100.json")
	config := filepath.Join(dir, "config.yaml")
	renamed := filepath.Join(dir, "renamed.yaml")
	for path, text := range map[string]string{whole: twoH100, mig: oneMigH100, config: timeSliced4, renamed: timeSliced4Renamed} {
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		fixture, inventory string
		args               []string
	}{
		{"v0.19.3-two-h100.labels", whole, nil},
		{"v0.19.3-two-h100-time-sliced-4.labels", whole, []string{"--config-file=" + config}},
		{"v0.19.3-two-h100-time-sliced-4-renamed.labels", whole, []string{"--config-file=" + renamed}},
		// The MIG labeler walks the GPU and compute instances to name each profile.
		{"v0.19.3-h100-mig-mixed.labels", mig, []string{"--mig-strategy=mixed"}},
	}
	for _, c := range cases {
		t.Run(c.fixture, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "labels")
			args := append([]string{
				"--oneshot", "--no-timestamp", "--use-node-feature-api=false", "--output-file=" + out,
				"--device-discovery-strategy=nvml", "--machine-type-file=/dev/null",
			}, c.args...)
			cmd := exec.Command(gfd, args...)
			cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+dir, "SWITCHYARD_NVML_MOCK_INVENTORY="+c.inventory)
			if log, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("gpu-feature-discovery: %v\n%s", err, log)
			}
			got, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			want, err := os.ReadFile(filepath.Join("..", "..", "..", "operator", "tests", "fixtures", "gfd", c.fixture))
			if err != nil {
				t.Fatal(err)
			}
			if g, w := sortedLines(string(got)), sortedLines(string(want)); g != w {
				t.Errorf("GFD wrote:\n%s\nthe fixture says:\n%s", g, w)
			}
		})
	}
}

func sortedLines(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}
