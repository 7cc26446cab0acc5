package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

const (
	migInventory = "../../driver-agent/examples/sim-inventory-mig.yaml"
	gpuInventory = "../../driver-agent/examples/sim-inventory.yaml"
)

func testLogger(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func TestResourcesFromShippedExamples(t *testing.T) {
	inv, err := loadInventory(gpuInventory)
	if err != nil {
		t.Fatal(err)
	}
	res, err := resources(inv, "nvidia.com")
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 1 || len(res["nvidia.com/gpu"]) != 8 {
		t.Fatalf("want 8 nvidia.com/gpu only, got %v", res)
	}
	if d := res["nvidia.com/gpu"][3]; d.ID != "GPU-9d7e04e7-e2ca-5535-ae8f-3796d5cee11c" || d.Minor != 3 {
		t.Fatalf("gpu 3: %+v", d)
	}

	inv, err = loadInventory(migInventory)
	if err != nil {
		t.Fatal(err)
	}
	res, err = resources(inv, "nvidia.com")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]device{
		"nvidia.com/gpu":         {{ID: "GPU-ee5f6d81-849d-5d95-8688-ce03f2fa8c81", Minor: 0}},
		"nvidia.com/mig-3g.40gb": {{ID: "MIG-959e5e26-8626-5ab6-8a2d-b0122049b5dc", Minor: 1}},
		"nvidia.com/mig-2g.20gb": {{ID: "MIG-dd65ea3d-ff9c-560b-9014-2812dd3665d0", Minor: 1}},
		"nvidia.com/mig-1g.10gb": {{ID: "MIG-63ff7c3e-6085-5607-9fc6-9af74805405e", Minor: 1}, {ID: "MIG-71101c8e-06b8-5e34-ada0-6f5d4e11caea", Minor: 1}},
	}
	assertResources(t, res, want)
	if got := gpuMinors(inv); !slices.Equal(got, []int{0, 1}) {
		t.Fatalf("minors %v", got)
	}
}

func assertResources(t *testing.T, got, want map[string][]device) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("resources %v, want %v", got, want)
	}
	for name, devs := range want {
		if !slices.Equal(got[name], devs) {
			t.Fatalf("%s: %v, want %v", name, got[name], devs)
		}
	}
}

func TestMIGEnabledRules(t *testing.T) {
	const head = "driverVersion: '1.0'\nunknownKey: ignored\ngpus:\n"
	for _, tc := range []struct {
		name, gpus string
		want       map[string][]device
		err        string
	}{
		{
			name: "no mig key is a whole GPU",
			gpus: "  - {index: 0, minor: 4, uuid: G0, productName: X}\n",
			want: map[string][]device{"example.com/gpu": {{"G0", 4}}},
		},
		{
			name: "migEnabled false without MIG devices is a whole GPU",
			gpus: "  - {index: 0, minor: 0, uuid: G0, migEnabled: false, mig: []}\n",
			want: map[string][]device{"example.com/gpu": {{"G0", 0}}},
		},
		{
			name: "absent migEnabled with MIG devices is MIG",
			gpus: "  - {index: 0, minor: 2, uuid: G0, mig: [{uuid: M0, profile: 1g.10gb}, {uuid: M1, profile: 1g.10gb+me}]}\n",
			want: map[string][]device{"example.com/mig-1g.10gb": {{"M0", 2}}, "example.com/mig-1g.10gb.me": {{"M1", 2}}},
		},
		{
			name: "migEnabled true without MIG devices advertises nothing",
			gpus: "  - {index: 0, minor: 0, uuid: G0, migEnabled: true}\n  - {index: 1, minor: 1, uuid: G1}\n",
			want: map[string][]device{"example.com/gpu": {{"G1", 1}}},
		},
		{
			name: "migEnabled false with MIG devices is rejected",
			gpus: "  - {index: 0, minor: 0, uuid: G0, migEnabled: false, mig: [{uuid: M0, profile: 1g.10gb}]}\n",
			err:  "migEnabled: false",
		},
		{
			name: "duplicate uuid is rejected",
			gpus: "  - {index: 0, minor: 0, uuid: G0}\n  - {index: 1, minor: 1, uuid: G0}\n",
			err:  "appears twice",
		},
		{
			name: "profile that is no resource name is rejected",
			gpus: "  - {index: 0, minor: 0, uuid: G0, mig: [{uuid: M0, profile: 'a b'}]}\n",
			err:  "valid resource name",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inv, err := parseInventory([]byte(head + tc.gpus))
			var res map[string][]device
			if err == nil {
				res, err = resources(inv, "example.com")
			}
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one mentioning %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			assertResources(t, res, tc.want)
		})
	}
}

func TestSocketName(t *testing.T) {
	if got := socketName("nvidia.com/mig-1g.10gb"); got != "switchyard-sim-nvidia-com-mig-1g-10gb.sock" {
		t.Fatal(got)
	}
}

func TestAllocate(t *testing.T) {
	byID := map[string]device{"GPU-A": {"GPU-A", 0}, "GPU-B": {"GPU-B", 3}, "MIG-C": {"MIG-C", 3}}
	req := &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{"GPU-B", "GPU-A"}},
		{DevicesIds: []string{"MIG-C", "GPU-B"}},
	}}
	resp, err := allocate("nvidia.com/gpu", byID, "/d", req)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.ContainerResponses) != 2 {
		t.Fatalf("%d container responses", len(resp.ContainerResponses))
	}
	control := []string{"/dev/nvidiactl=/d/nvidiactl", "/dev/nvidia-uvm=/d/nvidia-uvm", "/dev/nvidia-uvm-tools=/d/nvidia-uvm-tools"}
	for i, want := range []struct {
		env   string
		specs []string
	}{
		{"GPU-B,GPU-A", append([]string{"/dev/nvidia3=/d/nvidia3", "/dev/nvidia0=/d/nvidia0"}, control...)},
		{"MIG-C,GPU-B", append([]string{"/dev/nvidia3=/d/nvidia3"}, control...)},
	} {
		cr := resp.ContainerResponses[i]
		if len(cr.Envs) != 1 || cr.Envs["NVIDIA_VISIBLE_DEVICES"] != want.env {
			t.Errorf("container %d envs %v, want NVIDIA_VISIBLE_DEVICES=%s", i, cr.Envs, want.env)
		}
		var specs []string
		for _, d := range cr.Devices {
			if d.Permissions != "rw" {
				t.Errorf("container %d: %s permissions %q", i, d.ContainerPath, d.Permissions)
			}
			specs = append(specs, d.ContainerPath+"="+d.HostPath)
		}
		if !slices.Equal(specs, want.specs) {
			t.Errorf("container %d devices %v, want %v", i, specs, want.specs)
		}
	}

	_, err = allocate("nvidia.com/gpu", byID, "/d", &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"GPU-A", "GPU-X"}}}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "GPU-X") {
		t.Fatalf("unknown device: %v, want InvalidArgument naming GPU-X", err)
	}
}

func TestEnsureDevNodes(t *testing.T) {
	dir := t.TempDir()
	// A wrong file in the way is replaced.
	if err := os.WriteFile(filepath.Join(dir, "nvidia7"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for range 2 { // idempotent
		if err := ensureDevNodes(dir, []int{7}); err != nil {
			t.Fatal(err)
		}
	}
	for name, want := range map[string][2]uint32{
		"nvidia7": {195, 7}, "nvidiactl": {195, 255}, "nvidia-uvm": {508, 0}, "nvidia-uvm-tools": {508, 1},
	} {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(dir, name), &st); err != nil {
			t.Fatal(err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Mode&0o777 != 0o666 ||
			unix.Major(uint64(st.Rdev)) != want[0] || unix.Minor(uint64(st.Rdev)) != want[1] {
			t.Errorf("%s: mode %o rdev %d:%d, want char 0666 %d:%d", name, st.Mode,
				unix.Major(uint64(st.Rdev)), unix.Minor(uint64(st.Rdev)), want[0], want[1])
		}
	}
}

// fakeKubelet is the kubelet's Registration service on <dir>/kubelet.sock.
type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	requests chan *pluginapi.RegisterRequest
	srv      *grpc.Server
}

func startFakeKubelet(t *testing.T, dir string) *fakeKubelet {
	t.Helper()
	ln, err := net.Listen("unix", filepath.Join(dir, "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	k := &fakeKubelet{requests: make(chan *pluginapi.RegisterRequest, 16), srv: grpc.NewServer()}
	pluginapi.RegisterRegistrationServer(k.srv, k)
	go func() { _ = k.srv.Serve(ln) }()
	t.Cleanup(k.srv.Stop)
	return k
}

func (k *fakeKubelet) Register(_ context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.requests <- r
	return &pluginapi.Empty{}, nil
}

// registrations waits for n RegisterRequests and returns them by resource name.
func (k *fakeKubelet) registrations(t *testing.T, n int) map[string]*pluginapi.RegisterRequest {
	t.Helper()
	got := map[string]*pluginapi.RegisterRequest{}
	timeout := time.After(10 * time.Second)
	for len(got) < n {
		select {
		case r := <-k.requests:
			got[r.ResourceName] = r
		case <-timeout:
			t.Fatalf("got %d of %d registrations: %v", len(got), n, sortedKeys(got))
		}
	}
	return got
}

func dialPlugin(t *testing.T, socket string) pluginapi.DevicePluginClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pluginapi.NewDevicePluginClient(conn)
}

func recvIDs(t *testing.T, stream grpc.ServerStreamingClient[pluginapi.ListAndWatchResponse]) []string {
	t.Helper()
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, d := range resp.Devices {
		if d.Health != pluginapi.Healthy {
			t.Errorf("device %s health %q", d.ID, d.Health)
		}
		out = append(out, d.ID)
	}
	return out
}

func TestAgainstFakeKubelet(t *testing.T) {
	dir := t.TempDir()
	devDir := filepath.Join(dir, "switchyard-sim-dev")
	invPath := filepath.Join(dir, "inventory.yaml")
	migYAML, err := os.ReadFile(migInventory)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(invPath, migYAML, 0o644); err != nil {
		t.Fatal(err)
	}
	kubelet := startFakeKubelet(t, dir)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := config{inventory: invPath, resourcePrefix: "nvidia.com", pluginDir: dir, devDir: devDir,
		resync: 50 * time.Millisecond, kubeletPoll: 50 * time.Millisecond}
	done := make(chan error, 1)
	go func() { done <- run(ctx, cfg, testLogger(t)) }()

	regs := kubelet.registrations(t, 4)
	for _, name := range []string{"nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb", "nvidia.com/mig-3g.40gb"} {
		r := regs[name]
		if r == nil {
			t.Fatalf("%s did not register; got %v", name, sortedKeys(regs))
		}
		if r.Version != "v1beta1" || r.Endpoint != socketName(name) || r.Options == nil ||
			r.Options.PreStartRequired || r.Options.GetPreferredAllocationAvailable {
			t.Errorf("%s: bad RegisterRequest %v", name, r)
		}
	}

	socket := filepath.Join(dir, "switchyard-sim-nvidia-com-mig-1g-10gb.sock")
	client := dialPlugin(t, socket)
	opts, err := client.GetDevicePluginOptions(ctx, &pluginapi.Empty{})
	if err != nil || opts.PreStartRequired || opts.GetPreferredAllocationAvailable {
		t.Fatalf("options %v, %v", opts, err)
	}
	stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	m0, m1 := "MIG-63ff7c3e-6085-5607-9fc6-9af74805405e", "MIG-71101c8e-06b8-5e34-ada0-6f5d4e11caea"
	if got := recvIDs(t, stream); !slices.Equal(got, []string{m0, m1}) {
		t.Fatalf("first ListAndWatch %v", got)
	}
	resp, err := client.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{m1}}}})
	if err != nil {
		t.Fatal(err)
	}
	cr := resp.ContainerResponses[0]
	if cr.Envs["NVIDIA_VISIBLE_DEVICES"] != m1 || len(cr.Devices) != 4 ||
		cr.Devices[0].ContainerPath != "/dev/nvidia1" || cr.Devices[0].HostPath != filepath.Join(devDir, "nvidia1") {
		t.Fatalf("allocate: %v", cr)
	}
	for _, d := range cr.Devices {
		if _, err := os.Stat(d.HostPath); err != nil {
			t.Errorf("host path of %s: %v", d.ContainerPath, err)
		}
	}
	if _, err := client.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"GPU-ee5f6d81-849d-5d95-8688-ce03f2fa8c81"}}}}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("another resource's device: %v, want InvalidArgument", err)
	}

	// Drop one 1g.10gb and the 3g.40gb device: the stream gets the new set, and the 3g.40gb
	// server goes away.
	edited := `gpus:
  - {index: 0, minor: 0, uuid: GPU-ee5f6d81-849d-5d95-8688-ce03f2fa8c81}
  - index: 1
    minor: 1
    uuid: GPU-4f3b408e-0eba-5930-89bc-2a579ff53080
    mig:
      - {uuid: MIG-dd65ea3d-ff9c-560b-9014-2812dd3665d0, profile: 2g.20gb}
      - {uuid: MIG-63ff7c3e-6085-5607-9fc6-9af74805405e, profile: 1g.10gb}
`
	if err := os.WriteFile(invPath, []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := recvIDs(t, stream); !slices.Equal(got, []string{m0}) {
		t.Fatalf("ListAndWatch after edit %v", got)
	}
	removed := filepath.Join(dir, socketName("nvidia.com/mig-3g.40gb"))
	waitFor(t, func() bool { _, err := os.Stat(removed); return os.IsNotExist(err) }, "3g.40gb socket removal")

	// A kubelet restart: it deletes every socket in the directory and recreates kubelet.sock.
	kubelet.srv.Stop()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".sock") {
			_ = os.Remove(filepath.Join(dir, e.Name()))
		}
	}
	kubelet = startFakeKubelet(t, dir)
	regs = kubelet.registrations(t, 3)
	if _, ok := regs["nvidia.com/mig-3g.40gb"]; ok {
		t.Fatal("removed resource registered again")
	}
	stream, err = dialPlugin(t, socket).ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	if got := recvIDs(t, stream); !slices.Equal(got, []string{m0}) {
		t.Fatalf("ListAndWatch after kubelet restart %v", got)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return after cancel")
	}
	entries, _ = os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "switchyard-sim-") && strings.HasSuffix(e.Name(), ".sock") {
			t.Errorf("socket %s left behind", e.Name())
		}
	}
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
