package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// streamDrainTimeout bounds how long stopping a server waits for ListAndWatch streams to send
// their last update.
const streamDrainTimeout = 2 * time.Second

// plugin serves one extended resource on its own unix socket.
type plugin struct {
	pluginapi.UnimplementedDevicePluginServer

	resource string
	socket   string // absolute path
	devDir   string
	log      *slog.Logger

	// registered is only used by the manager's loop.
	registered bool

	mu      sync.Mutex
	devices []device
	byID    map[string]device
	version uint64        // bumped on every device change
	changed chan struct{} // closed and replaced on every device change

	// Per running server; nil when stopped.
	server  *grpc.Server
	stop    chan struct{}
	streams *sync.WaitGroup
	sockID  fileID
}

// socketName is the socket file name for a resource: switchyard-sim-nvidia-com-gpu.sock.
func socketName(resource string) string {
	return "switchyard-sim-" + strings.NewReplacer("/", "-", ".", "-").Replace(resource) + ".sock"
}

func newPlugin(resource, pluginDir, devDir string, log *slog.Logger, devs []device) *plugin {
	p := &plugin{
		resource: resource,
		socket:   filepath.Join(pluginDir, socketName(resource)),
		devDir:   devDir,
		log:      log.With("resource", resource),
		changed:  make(chan struct{}),
	}
	p.setDevices(devs)
	return p
}

// setDevices replaces the device set and wakes the ListAndWatch streams. It reports whether the
// set changed.
func (p *plugin) setDevices(devs []device) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.byID != nil && slices.Equal(p.devices, devs) {
		return false
	}
	byID := make(map[string]device, len(devs))
	for _, d := range devs {
		byID[d.ID] = d
	}
	p.devices = slices.Clone(devs)
	p.byID = byID
	p.version++
	close(p.changed)
	p.changed = make(chan struct{})
	return true
}

// start listens on the socket (replacing a stale file) and serves in the background.
func (p *plugin) start() error {
	if err := os.Remove(p.socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale socket: %w", err)
	}
	ln, err := net.Listen("unix", p.socket)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	id, _ := statID(p.socket)
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	p.mu.Lock()
	p.server, p.stop, p.streams, p.sockID = srv, make(chan struct{}), &sync.WaitGroup{}, id
	p.mu.Unlock()
	go func() {
		if err := srv.Serve(ln); err != nil {
			p.log.Error("device plugin server failed", "socket", p.socket, "err", err)
		}
	}()
	p.log.Info("serving device plugin", "socket", p.socket)
	return nil
}

// shutdown stops the server, after letting the streams send the current device set, and removes
// the socket if it is still ours. It is a no-op when stopped.
func (p *plugin) shutdown() {
	p.mu.Lock()
	srv, stop, streams, id := p.server, p.stop, p.streams, p.sockID
	p.server, p.stop, p.streams = nil, nil, nil
	if stop != nil {
		close(stop)
	}
	p.mu.Unlock()
	if srv == nil {
		return
	}
	drained := make(chan struct{})
	go func() { streams.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(streamDrainTimeout):
	}
	srv.Stop()
	if now, ok := statID(p.socket); ok && now == id {
		_ = os.Remove(p.socket)
	}
	p.log.Info("stopped device plugin", "socket", p.socket)
}

// socketIntact reports whether the socket file the server listens on is still in place (the
// kubelet deletes sockets in its device-plugins dir when it starts).
func (p *plugin) socketIntact() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	now, ok := statID(p.socket)
	return p.server != nil && ok && now == p.sockID
}

// register announces the plugin to the kubelet's Registration service.
func (p *plugin) register(ctx context.Context, kubeletSocket string) error {
	conn, err := grpc.NewClient("unix://"+kubeletSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("dial kubelet: %w", err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     filepath.Base(p.socket),
		ResourceName: p.resource,
		Options:      &pluginapi.DevicePluginOptions{},
	})
	if err != nil {
		return fmt.Errorf("register %s with kubelet: %w", p.resource, err)
	}
	return nil
}

// GetDevicePluginOptions says that neither PreStartContainer nor GetPreferredAllocation is
// supported.
func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

// ListAndWatch sends the device set, all Healthy, and again whenever it changes, until the
// stream ends or the server stops.
func (p *plugin) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	p.mu.Lock()
	stop, streams := p.stop, p.streams
	if stop == nil {
		p.mu.Unlock()
		return status.Error(codes.Unavailable, "device plugin is stopping")
	}
	streams.Add(1)
	p.mu.Unlock()
	defer streams.Done()

	var sent uint64
	first, stopping := true, false
	for {
		p.mu.Lock()
		devs, version, changed := p.devices, p.version, p.changed
		p.mu.Unlock()
		if first || version != sent {
			if err := stream.Send(listResponse(devs)); err != nil {
				return err
			}
			first, sent = false, version
		}
		if stopping {
			return nil
		}
		select {
		case <-changed:
		case <-stop:
			stopping = true // one last send of the current set
		case <-stream.Context().Done():
			return nil
		}
	}
}

func listResponse(devs []device) *pluginapi.ListAndWatchResponse {
	resp := &pluginapi.ListAndWatchResponse{Devices: make([]*pluginapi.Device, 0, len(devs))}
	for _, d := range devs {
		resp.Devices = append(resp.Devices, &pluginapi.Device{ID: d.ID, Health: pluginapi.Healthy})
	}
	return resp
}

// Allocate answers, per container, NVIDIA_VISIBLE_DEVICES and the device nodes the devices need.
func (p *plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	p.mu.Lock()
	byID := p.byID // replaced, never mutated
	p.mu.Unlock()
	resp, err := allocate(p.resource, byID, p.devDir, req)
	if err != nil {
		p.log.Warn("allocate refused", "err", err)
		return nil, err
	}
	for _, cr := range req.GetContainerRequests() {
		p.log.Info("allocate", "devices", cr.GetDevicesIds())
	}
	return resp, nil
}

// allocate builds the Allocate response; an unknown device ID is an InvalidArgument error.
func allocate(resource string, byID map[string]device, devDir string, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, cr := range req.GetContainerRequests() {
		ids := cr.GetDevicesIds()
		if len(ids) == 0 {
			return nil, status.Errorf(codes.InvalidArgument, "%s: container request without device IDs", resource)
		}
		var nodes []devNode
		for _, id := range ids {
			d, ok := byID[id]
			if !ok {
				return nil, status.Errorf(codes.InvalidArgument, "%s: unknown device %q", resource, id)
			}
			if n := gpuNode(d.Minor); !slices.Contains(nodes, n) {
				nodes = append(nodes, n)
			}
		}
		nodes = append(nodes, controlNodes...)
		cresp := &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": strings.Join(ids, ",")},
		}
		for _, n := range nodes {
			cresp.Devices = append(cresp.Devices, &pluginapi.DeviceSpec{
				ContainerPath: "/dev/" + n.name,
				HostPath:      filepath.Join(devDir, n.name),
				Permissions:   "rw",
			})
		}
		resp.ContainerResponses = append(resp.ContainerResponses, cresp)
	}
	return resp, nil
}

// GetPreferredAllocation is not supported (see GetDevicePluginOptions); it answers empty.
func (p *plugin) GetPreferredAllocation(context.Context, *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	return &pluginapi.PreferredAllocationResponse{}, nil
}

// PreStartContainer is not required (see GetDevicePluginOptions); it answers empty.
func (p *plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// fileID identifies one file: a recreated file differs in inode or change time.
type fileID struct {
	dev, ino uint64
	ctime    unix.Timespec
}

// statID returns the identity of path, and false when it cannot be stat'ed.
func statID(path string) (fileID, bool) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return fileID{}, false
	}
	return fileID{dev: uint64(st.Dev), ino: uint64(st.Ino), ctime: st.Ctim}, true
}
