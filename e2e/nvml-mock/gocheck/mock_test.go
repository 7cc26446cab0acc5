package gocheck

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/dl"
	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// The inventory the mock answers from: one whole H100, and one in MIG mode with two instances.
const inventory = `{
  "driverVersion": "580.95.05",
  "cudaDriverVersion": 13000,
  "gpus": [
    {"uuid": "GPU-11111111-2222-3333-4444-000000000000", "name": "NVIDIA H100 80GB HBM3",
     "memoryBytes": 85520809984, "pciBusId": "0000:18:00.0"},
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

// library is the mock's path: NVML_MOCK_LIBRARY, as e2e/hack/nvml-mock-check.sh sets it.
func library(t *testing.T) string {
	t.Helper()
	path := os.Getenv("NVML_MOCK_LIBRARY")
	if path == "" {
		t.Fatal("NVML_MOCK_LIBRARY is not set: run e2e/hack/nvml-mock-check.sh, which builds the mock first")
	}
	return path
}

// loaded writes text as the mock's inventory and loads the mock into this process through go-nvml,
// initialised; it returns the library, which the caller shuts down, and the inventory's path.
func loaded(t *testing.T, text string) (nvml.Interface, string) {
	t.Helper()
	inv := filepath.Join(t.TempDir(), "inventory.json")
	if err := os.WriteFile(inv, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SWITCHYARD_NVML_MOCK_INVENTORY", inv)
	lib := nvml.New(nvml.WithLibraryPath(library(t)))
	ok(t, "Init", lib.Init())
	return lib, inv
}

func ok(t *testing.T, what string, ret nvml.Return) {
	t.Helper()
	if ret != nvml.SUCCESS {
		t.Fatalf("%s: %v", what, nvml.ErrorString(ret))
	}
}

// TestNvidiasBindingsReadTheInventory loads the mock with go-nvml's nvml.New, the way NVIDIA's
// components load libnvidia-ml.so.1, into this Go process, and reads each GPU and MIG device.
func TestNvidiasBindingsReadTheInventory(t *testing.T) {
	lib, inv := loaded(t, inventory)
	defer lib.Shutdown()

	version, ret := lib.SystemGetDriverVersion()
	ok(t, "SystemGetDriverVersion", ret)
	cuda, ret := lib.SystemGetCudaDriverVersion()
	ok(t, "SystemGetCudaDriverVersion", ret)
	if version != "580.95.05" || cuda != 13000 {
		t.Errorf("driver %q, CUDA %d", version, cuda)
	}
	count, ret := lib.DeviceGetCount()
	ok(t, "DeviceGetCount", ret)
	if count != 2 {
		t.Fatalf("DeviceGetCount = %d, want 2", count)
	}

	type gpu struct {
		uuid, name, bus string
		minor           int
		memory          uint64
		mig             int
	}
	want := []gpu{
		{"GPU-11111111-2222-3333-4444-000000000000", "NVIDIA H100 80GB HBM3", "00000000:18:00.0", 0, 85520809984, nvml.DEVICE_MIG_DISABLE},
		{"GPU-11111111-2222-3333-4444-000000000001", "NVIDIA H100 80GB HBM3", "00000000:2A:00.0", 3, 85520809984, nvml.DEVICE_MIG_ENABLE},
	}
	for i, w := range want {
		d, ret := lib.DeviceGetHandleByIndex(i)
		ok(t, "DeviceGetHandleByIndex", ret)
		var got gpu
		got.uuid, ret = d.GetUUID()
		ok(t, "GetUUID", ret)
		got.name, ret = d.GetName()
		ok(t, "GetName", ret)
		pci, ret := d.GetPciInfo()
		ok(t, "GetPciInfo", ret)
		got.bus = cString(pci.BusId[:])
		got.minor, ret = d.GetMinorNumber()
		ok(t, "GetMinorNumber", ret)
		mem, ret := d.GetMemoryInfo()
		ok(t, "GetMemoryInfo", ret)
		got.memory = mem.Total
		got.mig, _, ret = d.GetMigMode()
		ok(t, "GetMigMode", ret)
		if got != w {
			t.Errorf("GPU %d: got %+v, want %+v", i, got, w)
		}
		byUUID, ret := lib.DeviceGetHandleByUUID(w.uuid)
		ok(t, "DeviceGetHandleByUUID", ret)
		if u, _ := byUUID.GetUUID(); u != w.uuid {
			t.Errorf("DeviceGetHandleByUUID(%s) gave %s", w.uuid, u)
		}
		// NVML's enumeration index, not the minor number: NVIDIA's DRA driver builds its CDI
		// device specs from it.
		index, ret := byUUID.GetIndex()
		ok(t, "GetIndex", ret)
		if index != i {
			t.Errorf("GetIndex of %s = %d, want %d", w.uuid, index, i)
		}
		// A function the mock does not implement answers as NVML does where a GPU lacks it.
		if _, ret := d.GetPowerUsage(); ret != nvml.ERROR_NOT_SUPPORTED {
			t.Errorf("GetPowerUsage: %v, want ERROR_NOT_SUPPORTED", nvml.ErrorString(ret))
		}
	}

	// The path between two GPUs, which NVIDIA's device plugin reads for every pair before it
	// prefers an allocation: the same GPU is internal; these two share no NUMA node.
	gpu0, _ := lib.DeviceGetHandleByIndex(0)
	gpu1, _ := lib.DeviceGetHandleByIndex(1)
	for _, c := range []struct {
		a, b nvml.Device
		want nvml.GpuTopologyLevel
	}{{gpu0, gpu0, nvml.TOPOLOGY_INTERNAL}, {gpu0, gpu1, nvml.TOPOLOGY_SYSTEM}} {
		level, ret := c.a.GetTopologyCommonAncestor(c.b)
		ok(t, "GetTopologyCommonAncestor", ret)
		if level != c.want {
			t.Errorf("GetTopologyCommonAncestor = %v, want %v", level, c.want)
		}
	}

	parent, _ := lib.DeviceGetHandleByIndex(1)
	max, ret := parent.GetMaxMigDeviceCount()
	ok(t, "GetMaxMigDeviceCount", ret)
	var migs []string
	for j := 0; j < max; j++ {
		m, ret := parent.GetMigDeviceHandleByIndex(j)
		ok(t, "GetMigDeviceHandleByIndex", ret)
		uuid, _ := m.GetUUID()
		name, _ := m.GetName()
		attrs, ret := m.GetAttributes()
		ok(t, "GetAttributes", ret)
		gi, ret := m.GetGpuInstanceId()
		ok(t, "GetGpuInstanceId", ret)
		isMig, ret := m.IsMigDeviceHandle()
		ok(t, "IsMigDeviceHandle", ret)
		migs = append(migs, strings.Join([]string{uuid, name, itoa(int(attrs.MultiprocessorCount)), itoa(gi), itoa(int(attrs.MemorySizeMB)), boolText(isMig)}, " "))
	}
	wantMigs := []string{
		"MIG-aaaaaaaa-0000-4000-8000-000000000001 NVIDIA H100 80GB HBM3 MIG 1g.10gb 16 9 9728 true",
		"MIG-aaaaaaaa-0000-4000-8000-000000000002 NVIDIA H100 80GB HBM3 MIG 3g.40gb 60 2 40608 true",
	}
	if strings.Join(migs, "\n") != strings.Join(wantMigs, "\n") {
		t.Errorf("MIG devices:\n%s\nwant:\n%s", strings.Join(migs, "\n"), strings.Join(wantMigs, "\n"))
	}

	// An XID raised through the faults file arrives through the event set, as NVIDIA's health
	// checks read it.
	set, ret := lib.EventSetCreate()
	ok(t, "EventSetCreate", ret)
	defer set.Free()
	first, _ := lib.DeviceGetHandleByIndex(0)
	ok(t, "RegisterEvents", first.RegisterEvents(nvml.EventTypeXidCriticalError, set))
	f, err := os.OpenFile(inv+".faults", os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(`{"uuid": "GPU-11111111-2222-3333-4444-000000000000", "kind": "xid", "xid": 48}` + "\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	data, ret := set.Wait(5000)
	ok(t, "EventSet.Wait", ret)
	if data.EventType != nvml.EventTypeXidCriticalError || data.EventData != 48 {
		t.Errorf("event %+v, want XID 48", data)
	}
	if u, _ := data.Device.GetUUID(); u != want[0].uuid {
		t.Errorf("event on %s, want %s", u, want[0].uuid)
	}
	if _, ret := set.Wait(100); ret != nvml.ERROR_TIMEOUT {
		t.Errorf("a second wait: %v, want ERROR_TIMEOUT (each fault is delivered once)", nvml.ErrorString(ret))
	}
}

// TestEveryNvmlFunctionIsExported: go-nvml binds every function of NVML's header; calling one the
// library lacks aborts the process, so the mock exports each (most answering NOT_SUPPORTED).
func TestEveryNvmlFunctionIsExported(t *testing.T) {
	t.Setenv("SWITCHYARD_NVML_MOCK_INVENTORY", filepath.Join(t.TempDir(), "none.json"))
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/NVIDIA/go-nvml").Output()
	if err != nil {
		t.Fatalf("go list go-nvml: %v", err)
	}
	header, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(out)), "pkg", "nvml", "nvml.h"))
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, m := range regexp.MustCompile(`DECLDIR (nvml[A-Za-z0-9_]+)\(`).FindAllSubmatch(header, -1) {
		names[string(m[1])] = true
	}
	if len(names) < 400 {
		t.Fatalf("only %d functions found in nvml.h", len(names))
	}
	lib := nvml.New(nvml.WithLibraryPath(library(t)))
	// Without an inventory the mock fails Init as a host without a driver does, yet the library
	// is loaded and its symbols can be looked up.
	if ret := lib.Init(); ret != nvml.ERROR_DRIVER_NOT_LOADED {
		t.Fatalf("Init without an inventory: %v, want ERROR_DRIVER_NOT_LOADED", nvml.ErrorString(ret))
	}
	handle := dl.New(library(t), dl.RTLD_LAZY|dl.RTLD_LOCAL)
	if err := handle.Open(); err != nil {
		t.Fatal(err)
	}
	defer handle.Close()
	var missing []string
	for name := range names {
		if err := handle.Lookup(name); err != nil {
			missing = append(missing, name)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("%d NVML functions are not exported (run e2e/hack/gen-nvml-stubs.sh): %s", len(missing), strings.Join(missing, ", "))
	}
}

func cString(b []int8) string {
	var s []byte
	for _, c := range b {
		if c == 0 {
			break
		}
		s = append(s, byte(c))
	}
	return string(s)
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}

func boolText(b bool) string {
	if b {
		return "true"
	}
	return "false"
}
